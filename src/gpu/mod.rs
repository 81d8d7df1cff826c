//! The GPU path: wgpu + WGSL compute shaders (Vulkan on phones, lavapipe in CI, GL fallback).
//!
//! - [`attention`]: KV cache store and attention (flash-decoding split, tiled prefill).
//! - [`device`]: adapter listing and lazy, fallible device bring-up ([`GpuContext`]).
//! - [`shaders`]: the kernel registry ([`KernelKey`]) composing `shaders/*.wgsl` fragments.
//! - [`repack`]: GGUF weight blocks to the GPU layout (aligned `u32` words, scales apart).
//! - [`kernels`]: pipeline cache, uploads, prepared dispatches, readback.
//! - [`matmul`]: the tiled, dequant-fused prefill matmul.
//! - [`ops`]: the element-wise and row ops of the forward pass (RoPE, SwiGLU, add, softmax,
//!   argmax, embedding lookup).
//! - [`attention`]: KV-cache store and attention (split over the sequence for decode, tiled for
//!   prefill).
//! - [`weights`]: the model's weights uploaded once ([`GpuModel`]), split across bindings when a
//!   tensor exceeds the binding limit.
//! - [`recorder`]: launches recorded into one command buffer per step, nothing created in the
//!   token loop.
//! - [`backend`]: [`GpuBackend`], the `Backend` the forward pass runs on.
//! - [`selftest`]: every kernel variant the adapter can run against kernels-ref.
//! - [`health`], [`startup`], [`known_bad`], [`variants`]: the start-up selftest of the
//!   variants a model needs, kept per adapter on disk; failed or known-bad variants replaced
//!   by their fallbacks, stages without any working variant kept on the CPU.
//! - [`layouts`]: the launch layouts (and so the key sets) chosen from the adapter's facts.
//! - [`pipelines`]: pipeline creation (reflected layouts, the on-disk pipeline cache).
//! - [`probe`]: the memory bandwidth probe `memwall bench` measures the floor with.
//! - [`q8act`]: the integer matvec path (int8 activation chunks, as the CPU computes).
//! - [`moe`]: the mixture-of-experts kernels (routing, the routed experts' matvecs, their
//!   weighted sum), the expert ids kept on the GPU.

pub mod attention;
pub mod backend;
pub mod device;
#[doc(hidden)]
pub mod faults;
pub mod health;
pub mod kernels;
pub mod known_bad;
pub mod layouts;
pub mod matmul;
pub mod moe;
pub mod ops;
pub mod params;
pub mod pipelines;
pub mod probe;
pub mod q8act;
pub mod recorder;
pub mod repack;
pub mod selftest;
pub mod shaders;
pub mod startup;
pub mod stream;
pub mod timing;
pub mod variants;
pub mod weights;

pub use backend::{GpuAct, GpuBackend};
pub use device::{list_adapters, AdapterInfoRow, DeviceSelector, GpuContext};
#[doc(hidden)]
pub use faults::GpuFaults;
pub use health::{HealthOptions, HealthReport};
pub use kernels::{Dispatch, GpuMatrix, KernelOptions, Kernels};
pub use known_bad::KnownBad;
pub use repack::{repack, PackedMatrix};
pub use shaders::{KernelKey, WeightFormat};
pub use weights::{needed_on_gpu, GpuLoadOptions, GpuModel};
