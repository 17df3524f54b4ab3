/// Element types a tensor can hold. Activations are always `F32`; the other types appear in
/// weights (kept as stored and widened per tile inside kernels) and in token ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    U32,
    U8,
    I32,
    I64,
    F64,
}

impl DType {
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::U32 | DType::I32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// The name safetensors uses in its header.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::U32 => "U32",
            DType::U8 => "U8",
            DType::I32 => "I32",
            DType::I64 => "I64",
            DType::F64 => "F64",
        }
    }

    pub fn from_safetensors_name(name: &str) -> Option<DType> {
        Some(match name {
            "F32" => DType::F32,
            "F16" => DType::F16,
            "BF16" => DType::BF16,
            "U32" => DType::U32,
            "U8" => DType::U8,
            "I32" => DType::I32,
            "I64" => DType::I64,
            "F64" => DType::F64,
            _ => return None,
        })
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }
}
