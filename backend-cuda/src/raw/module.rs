//! Modules and kernel launches: what [`crate::testing`] needs to load its
//! PTX kernels and queue them on a stream.

use std::ffi::{c_uint, c_void, CStr};

use cudarc::driver::sys;
use gpupool_core::StreamHandle;

use super::raw_stream;
use crate::error::{check, CudaError};

/// `cuModuleLoadData`: loads `image` into the current context (the driver
/// JIT-compiles PTX text).
///
/// # Safety
/// `image` is PTX text (NUL-terminated, as a `CStr` is): not a binary image,
/// which the driver would take on trust.
pub(crate) unsafe fn module_load_data(image: &CStr) -> Result<sys::CUmodule, CudaError> {
    let mut module: sys::CUmodule = core::ptr::null_mut();
    // SAFETY: `image` is NUL-terminated PTX text (this function's contract);
    // `module` is a valid place for the handle.
    check(unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr().cast()) })?;
    Ok(module)
}

/// `cuModuleGetFunction`: the kernel `name` of `module`.
///
/// # Safety
/// `module` is a loaded module, not unloaded.
pub(crate) unsafe fn module_get_function(
    module: sys::CUmodule,
    name: &CStr,
) -> Result<sys::CUfunction, CudaError> {
    let mut f: sys::CUfunction = core::ptr::null_mut();
    // SAFETY: `module` is loaded (this function's contract); `name` is
    // NUL-terminated; `f` is a valid place for the handle.
    check(unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) })?;
    Ok(f)
}

/// `cuLaunchKernel`: queues `function` on `stream` with `grid` blocks of
/// `block` threads, `shared_bytes` of dynamic shared memory, and the
/// arguments `params` points at (no `extra`).
///
/// # Safety
/// `function` is a kernel of a module loaded into the current context, not
/// unloaded; `params` has one pointer per kernel parameter, each to a value
/// of that parameter's type (the driver copies them before returning), and
/// whatever the kernel does with them is valid while it runs; `stream` is a
/// live stream of that context, or a special one.
pub(crate) unsafe fn launch_kernel(
    function: sys::CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_bytes: c_uint,
    stream: StreamHandle,
    params: &mut [*mut c_void],
) -> Result<(), CudaError> {
    // SAFETY: `function` is a kernel of the current context whose parameters
    // match `params`, and `stream` a live stream of that context or a special
    // one (this function's contract); the driver copies the arguments before
    // returning.
    check(unsafe {
        sys::cuLaunchKernel(
            function,
            grid[0],
            grid[1],
            grid[2],
            block[0],
            block[1],
            block[2],
            shared_bytes,
            raw_stream(stream),
            params.as_mut_ptr(),
            core::ptr::null_mut(),
        )
    })
}
