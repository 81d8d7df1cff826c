//! The GPU path: wgpu + WGSL compute shaders (Vulkan on phones, lavapipe in CI, GL fallback).
//!
//! - [`device`]: adapter listing and lazy, fallible device bring-up ([`GpuContext`]).
//! - [`shaders`]: the kernel registry ([`KernelKey`]) composing `shaders/*.wgsl` fragments.
//! - [`repack`]: GGUF weight blocks to the GPU layout (aligned `u32` words, scales apart).
//! - [`kernels`]: pipeline cache, uploads, prepared dispatches, readback.
//! - [`ops`]: the element-wise and row ops of the forward pass (RoPE, SwiGLU, add, softmax,
//!   argmax, embedding lookup).
//! - [`selftest`]: every kernel variant the adapter can run against kernels-ref.

pub mod device;
pub mod kernels;
pub mod ops;
pub mod repack;
pub mod selftest;
pub mod shaders;

pub use device::{list_adapters, AdapterInfoRow, DeviceSelector, GpuContext};
pub use kernels::{Dispatch, GpuMatrix, KernelOptions, Kernels};
pub use repack::{repack, PackedMatrix};
pub use shaders::{KernelKey, WeightFormat};
