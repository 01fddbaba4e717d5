//! [`CudaError`]: what a call to the CUDA backend can fail with.
//!
//! Most failures are the driver's own, kept as cudarc's [`DriverError`] so the
//! `CUresult` is there to match on. The others are found before the driver is
//! asked: no `libcuda` on this machine, a device ordinal out of range, one of
//! CUDA's special streams where a real one is needed, another backend's
//! stream, a capturing stream where the driver would refuse the call.

use core::fmt;

use cudarc::driver::{result::DriverError, sys};
use gpupool_core::{DeviceId, StreamHandle};

/// Why a call to the CUDA backend failed.
///
/// `Display` and `Debug` never call into the driver unless it is loaded, so an
/// error can be printed on a machine without `libcuda`. The message is
/// complete in itself (for a driver error: the `CUresult`'s name, number and
/// description) and there is no `source()`, so an error report that walks
/// the chain says each thing once.
///
/// ```
/// use gpupool_core::{Error, StreamPool};
/// use gpupool_cuda::{CudaBackend, CudaError};
///
/// match StreamPool::new(CudaBackend::new()).get(0) {
///     Ok(lease) => println!("a stream on {}", lease.device()),
///     Err(Error::Backend { source: CudaError::NoDriver, .. }) => println!("no CUDA driver here"),
///     Err(Error::NoDevice) => println!("a driver, but no GPU"),
///     Err(e) => println!("CUDA failed: {e}"),
/// }
/// ```
#[derive(Copy, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaError {
    /// The CUDA driver library (`libcuda.so` / `nvcuda.dll`) could not be
    /// loaded: this machine has no NVIDIA driver.
    NoDriver,
    /// `cuInit` failed; every later call fails the same way (the driver does
    /// not retry its initialisation either). `CUDA_ERROR_NO_DEVICE` is not
    /// reported here: it means zero devices, not a failure.
    Init(DriverError),
    /// A driver call failed with this `CUresult`.
    Driver(DriverError),
    /// The device ordinal is not below the device count.
    DeviceOutOfRange {
        /// The device asked for.
        device: DeviceId,
        /// How many devices the driver reports.
        count: u32,
    },
    /// One of CUDA's special streams (0, 1, 2) was passed where a created
    /// stream is needed (destroying it, asking which context owns it).
    SpecialStream(StreamHandle),
    /// A stream made by another backend than [`CudaBackend`](crate::CudaBackend)
    /// (its [`BackendId`](gpupool_core::BackendId) is not the CUDA
    /// backend's: a mock stream, say) was offered where a CUDA stream is
    /// needed ([`with_cudarc_owned_stream`](crate::with_cudarc_owned_stream)).
    /// Nothing was called.
    ForeignStream(StreamHandle),
    /// The stream is in a graph capture (active, or invalidated and not yet
    /// ended), and the call is one the driver refuses on a capturing stream,
    /// breaking the capture as it does
    /// ([`LeasedStream::synchronize`](crate::LeasedStream::synchronize)).
    /// Refused before the driver was asked: only the stream's capture status
    /// was read.
    StreamCapturing(StreamHandle),
    /// A copy named device memory that a graph capture allocated (a graph's
    /// own allocation, valid only while that graph's work runs) on a stream
    /// that is not capturing: its address means nothing outside the graph.
    /// Refused before the driver was asked.
    GraphMemory {
        /// The start of the range named.
        addr: usize,
    },
}

impl CudaError {
    /// The driver's `CUresult`, for [`Init`](Self::Init) and
    /// [`Driver`](Self::Driver).
    pub fn code(&self) -> Option<sys::CUresult> {
        match self {
            CudaError::Init(e) | CudaError::Driver(e) => Some(e.0),
            _ => None,
        }
    }

    /// Whether this is [`NoDriver`](Self::NoDriver): no `libcuda` on this
    /// machine.
    pub fn is_no_driver(&self) -> bool {
        matches!(self, CudaError::NoDriver)
    }

    /// Whether the driver is shutting down (`CUDA_ERROR_DEINITIALIZED`, seen
    /// from destructors that run during process exit).
    pub fn is_deinitialized(&self) -> bool {
        self.code() == Some(sys::CUresult::CUDA_ERROR_DEINITIALIZED)
    }
}

impl From<DriverError> for CudaError {
    fn from(e: DriverError) -> Self {
        CudaError::Driver(e)
    }
}

/// Writes a driver error as `NAME (code): description`. The description comes
/// from `cuGetErrorString`, asked only when the driver is loaded: cudarc's own
/// `Debug` and `Display` call it unconditionally, which panics without `libcuda`.
fn write_driver_error(f: &mut fmt::Formatter<'_>, e: &DriverError) -> fmt::Result {
    write!(f, "{:?} ({})", e.0, e.0 as u32)?;
    if crate::library::is_loaded() {
        if let Ok(text) = e.error_string() {
            write!(f, ": {}", text.to_string_lossy())?;
        }
    }
    Ok(())
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::NoDriver => f.write_str(
                "no CUDA driver: the libcuda shared library could not be loaded on this machine",
            ),
            CudaError::Init(e) => {
                f.write_str("the CUDA driver failed to initialise: ")?;
                write_driver_error(f, e)
            }
            CudaError::Driver(e) => {
                f.write_str("CUDA driver call failed: ")?;
                write_driver_error(f, e)
            }
            CudaError::DeviceOutOfRange { device, count } => match count {
                1 => write!(f, "{device} is out of range: there is 1 device"),
                _ => write!(f, "{device} is out of range: there are {count} devices"),
            },
            CudaError::SpecialStream(s) => write!(
                f,
                "stream handle {:#x} is one of CUDA's special streams, not a created one",
                s.as_raw()
            ),
            CudaError::ForeignStream(s) => write!(
                f,
                "stream handle {:#x} was made by another backend, not the CUDA one",
                s.as_raw()
            ),
            CudaError::StreamCapturing(s) => write!(
                f,
                "stream {:#x} is capturing a graph: synchronizing it would break the capture",
                s.as_raw()
            ),
            CudaError::GraphMemory { addr } => write!(
                f,
                "device address {addr:#x} is a graph's allocation, valid only in that graph's work"
            ),
        }
    }
}

impl fmt::Debug for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::NoDriver => f.write_str("NoDriver"),
            CudaError::Init(e) => f.debug_tuple("Init").field(&e.0).finish(),
            CudaError::Driver(e) => f.debug_tuple("Driver").field(&e.0).finish(),
            CudaError::DeviceOutOfRange { device, count } => f
                .debug_struct("DeviceOutOfRange")
                .field("device", device)
                .field("count", count)
                .finish(),
            CudaError::SpecialStream(s) => f.debug_tuple("SpecialStream").field(s).finish(),
            CudaError::ForeignStream(s) => f.debug_tuple("ForeignStream").field(s).finish(),
            CudaError::StreamCapturing(s) => f.debug_tuple("StreamCapturing").field(s).finish(),
            CudaError::GraphMemory { addr } => f
                .debug_struct("GraphMemory")
                .field("addr", &format_args!("{addr:#x}"))
                .finish(),
        }
    }
}

/// No [`source`](std::error::Error::source): the driver's `CUresult` (its
/// name, number and description) is part of this error's own message, so an
/// error chain prints it once. (cudarc's [`DriverError`] is still there to
/// match on: [`CudaError::Driver`], [`CudaError::code`].)
impl std::error::Error for CudaError {}

/// Turns a `CUresult` into `Ok(())` or a [`CudaError::Driver`].
#[inline]
pub(crate) fn check(r: sys::CUresult) -> Result<(), CudaError> {
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        other => Err(CudaError::Driver(DriverError(other))),
    }
}

/// `CUDA_ERROR_INVALID_VALUE`: an argument the backend refuses before the
/// driver is asked (a layout, a size no class holds, a host order).
pub(crate) fn invalid_value() -> CudaError {
    CudaError::Driver(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE))
}

/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub(crate) fn out_of_memory() -> CudaError {
    CudaError::Driver(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY))
}

/// `CUDA_ERROR_NOT_SUPPORTED`.
pub(crate) fn not_supported() -> CudaError {
    CudaError::Driver(DriverError(sys::CUresult::CUDA_ERROR_NOT_SUPPORTED))
}

/// A destroy or free that meets a driver already shut down
/// (`CUDA_ERROR_DEINITIALIZED`, at process exit) has nothing left to destroy
/// or free: success, as in DALI (#6166).
#[inline]
pub(crate) fn teardown_ok(r: Result<(), CudaError>) -> Result<(), CudaError> {
    match r {
        Err(e) if e.is_deinitialized() => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    /// The messages of `e`'s chain (`e`, its source, the source's source, ...).
    fn chain(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
        let mut out = vec![e.to_string()];
        let mut next = e.source();
        while let Some(s) = next {
            out.push(s.to_string());
            next = s.source();
        }
        out
    }

    #[test]
    fn only_a_driver_shut_down_counts_as_a_finished_teardown() {
        let deinit = CudaError::Driver(DriverError(sys::CUresult::CUDA_ERROR_DEINITIALIZED));
        assert_eq!(teardown_ok(Err(deinit)), Ok(()));
        assert_eq!(teardown_ok(Ok(())), Ok(()));
        for other in [
            invalid_value(),
            out_of_memory(),
            not_supported(),
            CudaError::NoDriver,
        ] {
            assert_eq!(teardown_ok(Err(other)), Err(other));
        }
        assert_eq!(
            invalid_value().code(),
            Some(sys::CUresult::CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            out_of_memory().code(),
            Some(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)
        );
        assert_eq!(
            not_supported().code(),
            Some(sys::CUresult::CUDA_ERROR_NOT_SUPPORTED)
        );
    }

    #[test]
    fn an_error_chain_says_each_thing_once() {
        let oom = DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        let stream = StreamHandle::LEGACY;
        let all = [
            CudaError::NoDriver,
            CudaError::Init(DriverError(sys::CUresult::CUDA_ERROR_INVALID_DEVICE)),
            CudaError::Driver(oom),
            CudaError::DeviceOutOfRange {
                device: DeviceId(3),
                count: 1,
            },
            CudaError::SpecialStream(stream),
            CudaError::ForeignStream(stream),
            CudaError::StreamCapturing(stream),
            CudaError::GraphMemory { addr: 0x7f00 },
        ];
        for e in all {
            let messages = chain(&e);
            for (i, m) in messages.iter().enumerate() {
                assert!(!m.is_empty(), "{e:?}: empty message at depth {i}");
                for later in &messages[i + 1..] {
                    assert!(
                        !m.contains(later.as_str()),
                        "{e:?}: {m:?} repeats its source {later:?}"
                    );
                }
            }
            // The driver's code is named once in the whole report.
            if let Some(code) = e.code() {
                let name = format!("{code:?}");
                let report = messages.join("\n");
                assert_eq!(report.matches(&name).count(), 1, "{report}");
            }
        }
        // The driver errors still say which call failed and why.
        let text = CudaError::Driver(oom).to_string();
        assert!(text.contains("CUDA_ERROR_OUT_OF_MEMORY (2)"), "{text}");
        assert!(CudaError::Driver(oom).source().is_none());
    }
}
