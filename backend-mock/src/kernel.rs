//! [`MockBackend::launch_map`]: a simulated kernel that computes, so that a
//! runtime written against the backend traits can run end to end on the mock
//! (upload, kernel, read-back) and check its results.
//!
//! Like `copy_async`, the kernel does its work at once, during the call, and
//! queues one work item on its stream that reads the source and writes the
//! destination until a test (or a synchronize) completes it; the hazard
//! detector checks those ranges as it checks a copy's. The user's function
//! never runs under the mock's lock: the source is read under the lock, the
//! function runs with the lock released, and the output is written under the
//! lock again, after every check was made anew.

use core::mem::size_of;

use bytemuck::{AnyBitPattern, NoUninit};
use gpupool_core::{AccessOrder, Backend, DeviceSlice};

use crate::error::MockError;
use crate::MockBackend;

impl MockBackend {
    /// A simulated kernel on `order`'s stream: `dst[i] = f(src[i])` for every
    /// `i`. `src` and `dst` may be the same memory (the source is read whole
    /// before anything is written).
    ///
    /// It runs at once and queues one work item on the stream that reads
    /// `src` and writes `dst` until it completes (as
    /// [`enqueue_work`](Self::enqueue_work) does, policy included). On a
    /// stream in a graph capture it is captured instead, and `f` is not
    /// called: a graph's replays model the kernel's memory uses, not its
    /// results (see [Capture](crate#capture)). The hazard detector sees the
    /// work item: a copy or kernel on another stream that uses
    /// the same memory without a wait is a
    /// [`ConcurrentUse`](crate::HazardKind::ConcurrentUse), a reset that
    /// frees it in another order a
    /// [`FreedWhileInUse`](crate::HazardKind::FreedWhileInUse). Read the result
    /// in the order it ran in (`Scratchpad::to_host` on a scratchpad of that
    /// order waits for it).
    ///
    /// A test-harness call, like [`use_memory`](Self::use_memory): not
    /// counted, no fault injection, and an error is not a [`Misuse`](crate::Misuse).
    /// `f` runs with no lock held, on the calling thread, once per element;
    /// if it panics nothing has been written or queued.
    ///
    /// Errors, with nothing written and nothing queued:
    /// [`MockError::HostOrder`] for host order (a kernel runs on a stream);
    /// [`MockError::ForeignOrder`] for a stream of another machine;
    /// [`MockError::InvalidStream`] / [`MockError::InvalidDevice`] for a stream
    /// this machine does not know (any more);
    /// [`MockError::LengthMismatch`] when the lengths differ;
    /// [`MockError::NotDeviceMemory`] for a slice not inside one live block of
    /// device memory of this machine; [`MockError::CrossDevice`] for device
    /// memory of another device than the stream's. The [refusals](crate#refusals)
    /// are recorded as hazards of the stream too: [`MockError::UseAfterFree`]
    /// for a slice whose block was reclaimed, [`MockError::HeldByGraph`] for a
    /// slice of a graph's block when the stream is not in that graph's
    /// capture (a scratchpad made in a capture and used after it); and so is
    /// a slice of this machine whose block is freed otherwise
    /// ([`NotDeviceMemory`](MockError::NotDeviceMemory), recorded as
    /// [`UsedAfterFree`](crate::HazardKind::UsedAfterFree)).
    ///
    /// ```
    /// use gpupool_core::{AccessOrder, DeviceId, Scratchpad, StreamBackend};
    /// use gpupool_mock::MockBackend;
    ///
    /// let gpu = MockBackend::new(1);
    /// let stream = gpu.create_stream(DeviceId(0), Default::default()).unwrap();
    /// // SAFETY: a live stream of this mock on device 0, destroyed after the
    /// // scratchpad is gone.
    /// let order = unsafe { AccessOrder::from_raw(&gpu, stream, DeviceId(0)) };
    /// let scratch = Scratchpad::new(&gpu, order).unwrap();
    /// let x = scratch.to_device(&[1u32, 2, 3]).unwrap();
    /// let y = scratch.device::<f32>(3).unwrap();
    /// gpu.launch_map(&order, &x, &y, |v| v as f32 * 0.5).unwrap();
    /// assert_eq!(scratch.to_host(&y).unwrap(), [0.5, 1.0, 1.5]);
    /// assert!(gpu.hazards().is_empty());
    /// # drop(scratch);
    /// # // SAFETY: the scratchpad that used it is gone.
    /// # unsafe { gpu.destroy_stream(stream, DeviceId(0)) }.unwrap();
    /// ```
    pub fn launch_map<T, U, F>(
        &self,
        order: &AccessOrder<'_>,
        src: &DeviceSlice<'_, T>,
        dst: &DeviceSlice<'_, U>,
        f: F,
    ) -> Result<(), MockError>
    where
        T: AnyBitPattern,
        U: NoUninit,
        F: FnMut(T) -> U,
    {
        if !order.is_usable_with(self) {
            return Err(MockError::ForeignOrder);
        }
        let (Some(stream), Some(device)) = (order.stream_handle(), order.device()) else {
            return Err(MockError::HostOrder);
        };
        if src.len() != dst.len() {
            return Err(MockError::LengthMismatch {
                src: src.len(),
                dst: dst.len(),
            });
        }
        let id = self.id();
        for (owner, addr, len) in [
            (src.backend_id(), src.addr(), src.byte_len()),
            (dst.backend_id(), dst.addr(), dst.byte_len()),
        ] {
            if owner != id {
                return Err(MockError::NotDeviceMemory { addr, len });
            }
        }
        let (src_range, dst_range) = ((src.addr(), src.byte_len()), (dst.addr(), dst.byte_len()));
        let n = src.len();

        // Read the source under the lock (or capture the kernel: it does
        // not run now).
        let input: Vec<T> = {
            let mut state = self.state();
            let key = state.stream_key(stream, device)?;
            state.check_device_range(key, src_range.0, src_range.1, device)?;
            state.check_device_range(key, dst_range.0, dst_range.1, device)?;
            if state.captures.of_stream(key).is_some() {
                state.kernel_use(key, src_range, dst_range);
                return Ok(());
            }
            let mut input = Vec::<T>::with_capacity(n);
            // SAFETY: `src` lies inside a live block of device memory of this
            // machine (checked above; no `&`/`&mut` to device memory exists,
            // and every write to it happens under this lock, which we hold),
            // so its `n * size_of::<T>()` bytes are readable, through the
            // slice's pointer, which keeps the block's provenance. They are
            // initialised (blocks start zeroed; the mock writes only
            // initialised bytes), and any bytes are a valid `T`
            // (`AnyBitPattern`). `input` has room for `n` `T`s and is another
            // allocation. Copying bytes needs no alignment.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    src.as_ptr().cast::<u8>().cast_const(),
                    input.as_mut_ptr().cast::<u8>(),
                    n * size_of::<T>(),
                );
                input.set_len(n);
            }
            input
        };

        // The user's function, with no lock held.
        let output: Vec<U> = input.into_iter().map(f).collect();

        // Check again (another thread may have freed or destroyed meanwhile),
        // queue the work item, write the destination.
        let mut state = self.state();
        let key = state.stream_key(stream, device)?;
        state.check_device_range(key, src_range.0, src_range.1, device)?;
        state.check_device_range(key, dst_range.0, dst_range.1, device)?;
        let captured = state.captures.of_stream(key).is_some();
        state.kernel_use(key, src_range, dst_range);
        if captured {
            // The stream began capturing meanwhile: the kernel was captured,
            // and does not run now.
            return Ok(());
        }
        // SAFETY: `dst` lies inside a live block of device memory of this
        // machine (checked again above, under the lock we hold, so no free
        // and no other write can run until we are done), valid for its
        // `n * size_of::<U>()` bytes, written through the slice's pointer,
        // which keeps the block's provenance; no reference to device memory
        // exists. `output` holds `n` `U`s, all bytes initialised (`NoUninit`),
        // in another allocation. Copying bytes needs no alignment.
        unsafe {
            core::ptr::copy_nonoverlapping(
                output.as_ptr().cast::<u8>(),
                dst.as_ptr().cast::<u8>(),
                n * size_of::<U>(),
            );
        }
        state.reclaim();
        Ok(())
    }
}
