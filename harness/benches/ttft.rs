//! TTFT benchmark (being written).
fn main() {}
