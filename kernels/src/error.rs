use thiserror::Error;

/// Every op returns this: a message a user can act on, never a panic.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    #[error("{op}: shape mismatch: {msg}")]
    Shape { op: &'static str, msg: String },
    #[error("{op}: unsupported dtype {dtype:?}: {msg}")]
    DType {
        op: &'static str,
        dtype: crate::DType,
        msg: String,
    },
    #[error("{op}: {msg}")]
    Invalid { op: &'static str, msg: String },
    #[error("{op}: not supported on the {backend} backend")]
    Unsupported {
        op: &'static str,
        backend: &'static str,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn shape_err<T>(op: &'static str, msg: impl Into<String>) -> Result<T> {
    Err(Error::Shape {
        op,
        msg: msg.into(),
    })
}

pub(crate) fn invalid<T>(op: &'static str, msg: impl Into<String>) -> Result<T> {
    Err(Error::Invalid {
        op,
        msg: msg.into(),
    })
}
