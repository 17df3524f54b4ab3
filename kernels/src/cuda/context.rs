//! The process's one CUDA device: its context, the stream every op runs on, the cuBLAS handle,
//! and the kernel modules compiled so far.
//!
//! Everything runs in order on the legacy default stream, so a device-to-host copy (which
//! waits for it) always sees every earlier op, and memory is allocated and freed stream-ordered
//! (`cuMemAllocAsync`/`cuMemFreeAsync`), so dropping a temporary never stalls the host.
//!
//! cudarc loads the driver, NVRTC and cuBLAS at run time and panics on a call into a library
//! it cannot find, so [`gpu`] checks all three are present before the first call and turns
//! their absence into an error that says what to install.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use cudarc::driver::{result as drv, sys};

use super::launch::Launch;
use super::signature::{self, Kind};
use super::sources::{self, Source};
use crate::error::Result;
use crate::Error;

/// The device the backend uses: the first one CUDA shows (pick another with
/// `CUDA_VISIBLE_DEVICES`).
const ORDINAL: i32 = 0;

pub(crate) struct Gpu {
    ctx: sys::CUcontext,
    pub(crate) stream: sys::CUstream,
    pub(crate) blas: cudarc::cublas::sys::cublasHandle_t,
    /// Compute capability `(major, minor)`.
    pub arch: (u32, u32),
    pub name: String,
    modules: Mutex<HashMap<&'static str, Module>>,
}

struct Module {
    handle: sys::CUmodule,
    /// Kernels looked up so far, with their parameter kinds read from the source.
    functions: HashMap<&'static str, (sys::CUfunction, Vec<Kind>)>,
}

// SAFETY: driver API handles (context, module, function, cuBLAS handle) may be used from any
// thread once the context is current there, which `gpu()` makes it; the module table is
// behind a mutex.
unsafe impl Send for Gpu {}
unsafe impl Sync for Gpu {}

static GPU: OnceLock<std::result::Result<Gpu, String>> = OnceLock::new();

pub(crate) fn cuda_err(op: &'static str, msg: impl std::fmt::Display) -> Error {
    Error::Invalid {
        op,
        msg: format!("CUDA: {msg}"),
    }
}

/// The device, initialised on first use, with its context made current on this thread.
pub(crate) fn gpu() -> Result<&'static Gpu> {
    let g = GPU
        .get_or_init(init)
        .as_ref()
        .map_err(|e| cuda_err("cuda", e))?;
    // SAFETY: a context retained in `init` and never released.
    unsafe { drv::ctx::set_current(g.ctx) }.map_err(|e| cuda_err("cuda", format!("{e:?}")))?;
    Ok(g)
}

/// Whether the CUDA backend can run here: `Ok` with the device's description, or the reason
/// it cannot (no driver, no GPU, a missing library), phrased for the user.
pub fn probe() -> std::result::Result<String, String> {
    match GPU.get_or_init(init) {
        Ok(g) => Ok(format!(
            "{} (compute capability {}.{})",
            g.name, g.arch.0, g.arch.1
        )),
        Err(e) => Err(e.clone()),
    }
}

/// The device's name (`NVIDIA H200`, `NVIDIA GB10`), once the backend runs.
pub fn device_name() -> Option<String> {
    GPU.get()?.as_ref().ok().map(|g| g.name.clone())
}

fn init() -> std::result::Result<Gpu, String> {
    // SAFETY: only tries to open the library.
    if !unsafe { sys::is_culib_present() } {
        return Err(
            "no NVIDIA driver on this machine (libcuda.so.1 not found): the CUDA \
                    backend needs an NVIDIA GPU with its driver installed"
                .into(),
        );
    }
    drv::init().map_err(|e| format!("the NVIDIA driver failed to start (cuInit: {e:?})"))?;
    let count = drv::device::get_count().map_err(|e| format!("cuDeviceGetCount: {e:?}"))?;
    if count <= ORDINAL {
        return Err(
            "the NVIDIA driver is installed but sees no GPU (check `nvidia-smi` and \
                    CUDA_VISIBLE_DEVICES)"
                .into(),
        );
    }
    if !sources::nvrtc_present() {
        return Err(missing_library(
            "NVRTC",
            "libnvrtc.so.13",
            "nvidia-cuda-nvrtc",
        ));
    }
    // SAFETY: only tries to open the library.
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Err(missing_library(
            "cuBLAS",
            "libcublas.so.13",
            "nvidia-cublas",
        ));
    }
    let dev = drv::device::get(ORDINAL).map_err(|e| format!("cuDeviceGet: {e:?}"))?;
    let name = drv::device::get_name(dev).map_err(|e| format!("cuDeviceGetName: {e:?}"))?;
    let attr = |a| {
        // SAFETY: `dev` is a valid device handle.
        unsafe { drv::device::get_attribute(dev, a) }
            .map_err(|e| format!("cuDeviceGetAttribute: {e:?}"))
    };
    let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    // SAFETY: the primary context of a valid device, retained for the life of the process.
    let ctx = unsafe { drv::primary_ctx::retain(dev) }
        .map_err(|e| format!("cuDevicePrimaryCtxRetain: {e:?}"))?;
    unsafe { drv::ctx::set_current(ctx) }.map_err(|e| format!("cuCtxSetCurrent: {e:?}"))?;
    let stream = drv::stream::null();
    let blas =
        cudarc::cublas::result::create_handle().map_err(|e| format!("cublasCreate: {e:?}"))?;
    // SAFETY: a fresh handle and the legacy default stream of the current context.
    unsafe { cudarc::cublas::result::set_stream(blas, stream as _) }
        .map_err(|e| format!("cublasSetStream: {e:?}"))?;
    Ok(Gpu {
        ctx,
        stream,
        blas,
        arch: (major as u32, minor as u32),
        name,
        modules: Mutex::new(HashMap::new()),
    })
}

fn missing_library(what: &str, file: &str, wheel: &str) -> String {
    format!(
        "{what} ({file}) not found: install it (`pip install {wheel}`, or the CUDA toolkit) \
         and put its lib directory on LD_LIBRARY_PATH; ci/gpu-check.sh shows how"
    )
}

/// A kernel argument: a device pointer (`u64`), a size or a scalar, passed by address as
/// `cuLaunchKernel` wants, with the parameter kind it must meet.
pub(crate) trait Arg {
    fn addr(&self) -> *mut c_void;
    fn kind(&self) -> Kind;
}

macro_rules! plain_arg {
    ($($t:ty => $k:ident),*) => {$(
        impl Arg for $t {
            fn addr(&self) -> *mut c_void {
                self as *const $t as *mut c_void
            }
            fn kind(&self) -> Kind {
                Kind::$k
            }
        }
    )*};
}
plain_arg!(u64 => Ptr, i64 => I64, i32 => I32, u32 => U32, f32 => F32);

impl Gpu {
    /// Launches kernel `name` of `file` (compiled for this device on first use). `args` must
    /// match the kernel's parameter list in kind and order: checked against the source's
    /// declaration, so a mismatch is an error here instead of corrupt memory on the GPU.
    pub(crate) fn launch(
        &self,
        file: &Source,
        name: &'static str,
        l: Launch,
        args: &[&dyn Arg],
    ) -> Result<()> {
        let kinds: Vec<Kind> = args.iter().map(|a| a.kind()).collect();
        let f = self.function(file, name, &kinds)?;
        let mut params: Vec<*mut c_void> = args.iter().map(|a| a.addr()).collect();
        // SAFETY: `f` is a live function of a loaded module; `params` point at values that
        // outlive the call (cuLaunchKernel copies them before returning), and their types and
        // count follow the kernel's signature (each op's contract with its .cu file).
        unsafe {
            drv::launch_kernel(f, l.grid, l.block, 0, self.stream, &mut params)
                .map_err(|e| cuda_err("launch", format!("{name}: {e:?}")))
        }
    }

    fn function(
        &self,
        file: &Source,
        name: &'static str,
        args: &[Kind],
    ) -> Result<sys::CUfunction> {
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if !modules.contains_key(file.name) {
            let compiled = sources::compile(file, self.arch)
                .map_err(|e| cuda_err("nvrtc", format!("compiling {e}")))?;
            // SAFETY: NUL-terminated PTX text from NVRTC.
            let handle = unsafe { drv::module::load_data(compiled.ptx.as_ptr().cast()) }
                .map_err(|e| {
                    cuda_err(
                        "nvrtc",
                        format!(
                            "loading {}: {e:?} (an NVRTC newer than the driver emits PTX the \
                             driver cannot load: `ci/cuda/setup.sh --runtime` installs a matching one)",
                            file.name
                        ),
                    )
                })?;
            modules.insert(
                file.name,
                Module {
                    handle,
                    functions: HashMap::new(),
                },
            );
        }
        let m = modules.get_mut(file.name).expect("inserted above");
        if !m.functions.contains_key(name) {
            let kinds = signature::params(file, name).ok_or_else(|| {
                cuda_err("launch", format!("{} declares no kernel {name}", file.name))
            })?;
            let cname = std::ffi::CString::new(name).expect("kernel names hold no NUL");
            // SAFETY: a loaded module and a NUL-terminated name.
            let f = unsafe { drv::module::get_function(m.handle, cname) }.map_err(|e| {
                cuda_err("launch", format!("kernel {name} in {}: {e:?}", file.name))
            })?;
            m.functions.insert(name, (f, kinds));
        }
        let (f, kinds) = &m.functions[name];
        if kinds.as_slice() != args {
            return Err(cuda_err(
                "launch",
                format!(
                    "kernel {name} in {} takes {kinds:?}, the launch passes {args:?}",
                    file.name
                ),
            ));
        }
        Ok(*f)
    }
}
