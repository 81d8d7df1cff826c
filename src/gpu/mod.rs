//! The GPU path: wgpu + WGSL compute shaders (Vulkan on phones, lavapipe in CI, GL fallback).
//! One folder per question:
//!
//! - [`registry`]: which kernels exist: the [`KernelKey`]s composing `shaders/*.wgsl`
//!   fragments, and the uniform parameter structs they take ([`registry::params`]).
//! - [`kernels`]: how a kernel is compiled and launched: the pipeline cache and prepared
//!   dispatches ([`Kernels`]), pipeline creation ([`kernels::pipelines`]), and one file per op
//!   family: [`kernels::ops`] (RoPE, SwiGLU, add, softmax, argmax, embedding lookup),
//!   [`kernels::attention`] (KV store, split decode and tiled prefill attention),
//!   [`kernels::matmul`] (the tiled prefill matmul), [`kernels::q8act`] (the integer matvec
//!   path), [`kernels::moe`] (routing, the routed experts' products, their weighted sum).
//! - [`health`]: which variants work on this adapter: the start-up check of a model's variants
//!   kept per adapter on disk ([`health::startup`]), the known-bad list, the fallback chains
//!   ([`health::variants`]), the launch layouts chosen from the adapter's facts
//!   ([`health::layouts`]) and the selftest of every variant against kernels-ref
//!   ([`health::selftest`]).
//! - [`device`]: adapter listing and lazy, fallible device bring-up ([`GpuContext`]);
//!   [`faults`]: fault injection for the failover tests; [`probe`]: the memory bandwidth probe.
//! - [`repack`]: GGUF weight blocks to the GPU layout (aligned `u32` words, scales apart);
//!   [`weights`]: the model's weights uploaded once ([`GpuModel`]), split across bindings when a
//!   tensor exceeds the binding limit; [`stream`]: blocks streamed through slots.
//! - [`recorder`]: launches recorded into one command buffer per step, nothing created in the
//!   token loop; [`timing`]: stage timestamps.
//! - [`backend`]: [`GpuBackend`], the `Backend` the forward pass runs on.

pub mod backend;
pub mod device;
#[doc(hidden)]
pub mod faults;
pub mod health;
pub mod kernels;
pub mod probe;
pub mod recorder;
pub mod registry;
pub mod repack;
pub mod stream;
pub mod timing;
pub mod weights;

pub use backend::{GpuAct, GpuBackend};
pub use device::{list_adapters, AdapterInfoRow, DeviceSelector, GpuContext};
#[doc(hidden)]
pub use faults::GpuFaults;
pub use health::known_bad::KnownBad;
pub use health::{HealthOptions, HealthReport};
pub use kernels::{Dispatch, GpuMatrix, KernelOptions, Kernels};
pub use registry::{KernelKey, WeightFormat};
pub use repack::{repack, PackedMatrix};
pub use weights::{needed_on_gpu, GpuLoadOptions, GpuModel};
