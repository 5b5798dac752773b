//! The split runtime's NPU side on the host: a client of the DSP service.
//!
//! - [`policy`]: which precision (FP16 or Q8_0) each projection kind is
//!   resident in;
//! - [`client`]: [`NpuClient`], one session with the service (resident
//!   weights, one request in flight, restart and reload on faults);
//! - [`projection`]: [`NpuProjection`], the [`crate::projection::Projection`]
//!   whose products are service requests;
//! - [`transport`]: the roads to the service (in-process, shared memory,
//!   simulator, FastRPC);
//! - [`firmware_log`]: decodes the firmware's defmt log frames.
//!
//! ```no_run
//! use hexlora::npu::{NpuClient, NpuOptions, PrecisionPolicy, TransportKind};
//! let client = NpuClient::connect(TransportKind::SharedMemory, &NpuOptions::default())?;
//! let policy = PrecisionPolicy::default();
//! let factory = |info: hexlora::projection::ProjectionInfo, raw: &hexlora::model::source::RawTensor<'_>| {
//!     let p = policy.for_kind(info.kind);
//!     client.load_weight(info, raw, p)
//! };
//! # let _ = factory;
//! # Ok::<(), hexlora::Error>(())
//! ```

pub mod client;
pub mod firmware_log;
pub mod policy;
pub mod projection;
pub mod transport;

pub use client::{NpuClient, NpuOptions, NpuStats, ResidentBytes};
pub use policy::{Precision, PrecisionPolicy};
pub use projection::NpuProjection;
pub use transport::TransportKind;
