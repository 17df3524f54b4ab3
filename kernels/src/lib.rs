//! Device compute for the engine: one `Tensor` type, one op list (`ops`), and a backend per
//! device. Models call `ops::*`; backends never know what a model is.

mod backend;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod dtype;
mod error;
#[cfg(feature = "mlx")]
pub mod mlx;
pub mod numerics;
pub mod ops;
pub mod params;
pub mod quant;
pub mod select;
pub mod settings;
mod storage;
mod tensor;

pub use cpu::pool::run;
pub use dtype::DType;
pub use error::{Error, Result};
pub use quant::{QuantMode, QuantSpec, QuantWeight, Weight};
pub use settings::Settings;
pub use storage::{AlignedBuf, ByteOwner, Bytes, Device, Storage};
pub use tensor::{numel, Tensor};
