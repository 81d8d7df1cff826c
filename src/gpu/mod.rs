//! The GPU path: wgpu + WGSL compute shaders (Vulkan on phones, lavapipe in CI, GL fallback).
//!
//! - [`device`]: adapter listing and lazy, fallible device bring-up ([`GpuContext`]).
//! - [`shaders`]: the kernel registry ([`KernelKey`]) composing `shaders/*.wgsl` fragments.
//! - [`repack`]: GGUF weight blocks to the GPU layout (aligned `u32` words, scales apart).
//! - [`kernels`]: pipeline cache, uploads, prepared dispatches, readback.
//! - [`ops`]: the element-wise and row ops of the forward pass (RoPE, SwiGLU, add, softmax,
//!   argmax, embedding lookup).
//! - [`q8act`]: the integer matvec path (int8 activation chunks, as the CPU computes).

pub mod device;
pub mod kernels;
pub mod ops;
pub mod q8act;
pub mod repack;
pub mod shaders;

pub use device::{list_adapters, AdapterInfoRow, DeviceSelector, GpuContext};
pub use kernels::{Dispatch, GpuMatrix, Kernels};
pub use repack::{repack, PackedMatrix};
pub use shaders::{KernelKey, WeightFormat};
