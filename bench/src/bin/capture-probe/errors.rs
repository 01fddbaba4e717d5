//! Errors: an operation's failure, the short forms for the table, the errors
//! parked in the pools and those reported as lost.

use std::any::Any;
use std::sync::Mutex;

use gpupool_cuda::cudarc::driver::sys;
use gpupool_cuda::CudaError;

use crate::{GpuError, SUCCESS};

/// An operation's failure: the short form for the table, the long one for
/// the details.
pub(crate) struct Fail {
    pub(crate) short: String,
    pub(crate) long: String,
}

pub(crate) type Res = Result<(), Fail>;

pub(crate) fn short_error(e: &GpuError) -> String {
    match e {
        gpupool_core::Error::Backend { op, source } => match source.code() {
            Some(c) => format!("{op:?} {c:?}"),
            None => format!("{op:?} {source:?}"),
        },
        other => format!("{other:?}"),
    }
}

pub(crate) fn labelled(step: &str, s: String) -> String {
    if step.is_empty() {
        s
    } else {
        format!("{step}: {s}")
    }
}

/// A gpupool result, with the step it came from.
pub(crate) fn at<T>(step: &str, r: Result<T, GpuError>) -> Result<T, Fail> {
    r.map_err(|e| Fail {
        short: labelled(step, short_error(&e)),
        long: labelled(step, format!("{e:#}")),
    })
}

/// A backend (not pool) result.
pub(crate) fn backend<T>(step: &str, r: Result<T, CudaError>) -> Result<T, Fail> {
    r.map_err(|e| Fail {
        short: labelled(
            step,
            e.code()
                .map_or_else(|| format!("{e:?}"), |c| format!("{c:?}")),
        ),
        long: labelled(step, format!("{e}")),
    })
}

/// A raw driver result.
pub(crate) fn raw(step: &str, r: sys::CUresult) -> Res {
    if r == SUCCESS {
        Ok(())
    } else {
        let s = labelled(step, format!("{r:?}"));
        Err(Fail {
            short: s.clone(),
            long: s,
        })
    }
}

/// Errors reported through the lost-error hook (drops with no owner).
pub(crate) static LOST: Mutex<Vec<String>> = Mutex::new(Vec::new());

pub(crate) fn lost_hook(e: &dyn std::fmt::Display) {
    if let Ok(mut v) = LOST.lock() {
        v.push(format!("{e:#}"));
    }
}

pub(crate) fn take_lost() -> Vec<String> {
    LOST.lock()
        .map(|mut v| std::mem::take(&mut *v))
        .unwrap_or_default()
}

/// "Op CUDA_ERROR_X" out of a long error text.
pub(crate) fn short_of_text(s: &str) -> String {
    let op = s
        .find("backend call ")
        .and_then(|i| {
            let rest = &s[i + "backend call ".len()..];
            rest.find(' ').map(|j| rest[..j].to_string())
        })
        .unwrap_or_default();
    let code = s
        .find("CUDA_ERROR_")
        .map(|i| {
            s[i..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || *c == '_' || c.is_ascii_digit())
                .collect::<String>()
        })
        .unwrap_or_else(|| s.chars().take(60).collect());
    if op.is_empty() {
        code
    } else {
        format!("{op} {code}")
    }
}

pub(crate) fn panic_text(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic)".into()
    }
}
