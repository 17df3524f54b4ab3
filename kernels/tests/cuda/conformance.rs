//! Op conformance of the CUDA backend against the CPU reference (docs/design.md §3): the shared
//! table of `common/conformance.rs` on `Device::Cuda`, one test per op group, one group at a
//! time on the GPU.
//!
//! Without a usable GPU each test prints `SKIPPED` with the reason (no driver, no device, a
//! missing library), checks that moving a tensor to the GPU fails with that reason instead of
//! panicking, and runs the CPU side of every case of its group (so the table is ready for a
//! GPU). `CUDA_CONFORMANCE_REQUIRED=1` (set by `ci/gpu-check.sh`) makes a skip a failure.

use std::sync::Mutex;

use crate::common::conformance::{check, check_cpu_side, Group};
use kernels::{Device, Tensor};

/// The backend drives one stream and one cuBLAS handle: the groups take turns.
static GPU: Mutex<()> = Mutex::new(());

fn on_cuda(group: Group) {
    let _turn = GPU.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(why) = kernels::cuda::probe() {
        // Up to the device: the error path must be an error naming the reason, not a panic,
        // and every case's CPU side must run.
        let e = Tensor::zeros(&[2])
            .to_device(Device::Cuda)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&why), "{e}");
        let n = check_cpu_side(group);
        assert!(
            std::env::var("CUDA_CONFORMANCE_REQUIRED").as_deref() != Ok("1"),
            "no GPU: {why}"
        );
        eprintln!("SKIPPED: CUDA op conformance, {group:?} ({n} cases, CPU side checked): {why}");
        return;
    }
    eprintln!("device: {}", kernels::cuda::probe().unwrap());
    check(Device::Cuda, group);
}

#[test]
fn matmul() {
    on_cuda(Group::Matmul)
}

#[test]
fn quant() {
    on_cuda(Group::Quant)
}

#[test]
fn embedding() {
    on_cuda(Group::Embedding)
}

#[test]
fn rows() {
    on_cuda(Group::Rows)
}

#[test]
fn elementwise() {
    on_cuda(Group::Elementwise)
}

#[test]
fn attention() {
    on_cuda(Group::Attention)
}

#[test]
fn gdn() {
    on_cuda(Group::Gdn)
}

#[test]
fn moe() {
    on_cuda(Group::Moe)
}
