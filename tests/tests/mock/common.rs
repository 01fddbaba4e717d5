//! Set-up shared by the mock tests: leases taken in a row from one pool, a
//! capture begun on the first of them, side leases forked into a capture,
//! and the clean-up checks that end most tests.
#![cfg(not(feature = "cuda"))]

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};

use gpupool_core::{
    set_lost_error_hook, AccessOrder, CaptureMode, CaptureStatus, DeviceId, DeviceSlice, Error,
    EventPool, Scratchpad, ScratchpadConfig, StreamHandle, StreamLease, StreamPool,
};
use gpupool_mock::{MockBackend, MockError};

/// Takes `N` leases of device 0 from `streams`, one after another (first
/// element first), as `N` lines of `streams.get(0).unwrap()` would.
pub(crate) fn leases<const N: usize>(
    streams: &StreamPool<MockBackend>,
) -> [StreamLease<'_, MockBackend>; N] {
    std::array::from_fn(|_| streams.get(0).unwrap())
}

/// A one-device mock with its two pools (`mock_pools(1)`) and leases taken
/// from its stream pool, in one line: `mock_rig!(gpu, streams, events;
/// [origin, side] = leases)` binds `gpu`, `streams`, `events` and the leases
/// of [`leases`]; `... = capturing(mode)` takes them with [`capturing`] (and
/// `two_capturing(mode)` with [`two_capturing`]).
macro_rules! mock_rig {
    ($gpu:ident, $streams:ident, $events:ident; [$($lease:tt),+] = leases) => {
        let ($gpu, $streams, $events) = gpupool_tests::mock_pools(1);
        let [$($lease),+] = $crate::common::leases(&$streams);
    };
    ($gpu:ident, $streams:ident, $events:ident; [$($lease:tt),+] = $take:ident($mode:expr)) => {
        let ($gpu, $streams, $events) = gpupool_tests::mock_pools(1);
        let [$($lease),+] = $crate::common::$take(&$streams, $mode);
    };
}
pub(crate) use mock_rig;

/// The three special streams of `device` (null, legacy, per-thread), as
/// orders.
pub(crate) fn special_orders(device: DeviceId) -> [AccessOrder<'static>; 3] {
    [
        AccessOrder::null_stream(device),
        AccessOrder::legacy_stream(device),
        AccessOrder::per_thread_stream(device),
    ]
}

/// Takes `N` leases (as [`leases`]), then begins a capture in `mode` on the
/// first (the origin), as `begin_capture(mode).unwrap()` after the leases.
#[track_caller]
pub(crate) fn capturing<const N: usize>(
    streams: &StreamPool<MockBackend>,
    mode: CaptureMode,
) -> [StreamLease<'_, MockBackend>; N] {
    let taken = leases(streams);
    taken[0].begin_capture(mode).unwrap();
    taken
}

/// Takes `N` leases (as [`leases`]), then begins two separate captures in
/// `mode`: one on the first lease, then one on the second.
#[track_caller]
pub(crate) fn two_capturing<const N: usize>(
    streams: &StreamPool<MockBackend>,
    mode: CaptureMode,
) -> [StreamLease<'_, MockBackend>; N] {
    let taken = capturing(streams, mode);
    taken[1].begin_capture(mode).unwrap();
    taken
}

/// Scratchpads refuse the per-thread stream `per_thread` as their device
/// order, and as their pinned release order (with `device` as the device
/// order): `Error::PerThreadStream` both times.
#[track_caller]
pub(crate) fn assert_scratchpads_refuse(
    gpu: &MockBackend,
    per_thread: AccessOrder<'_>,
    device: AccessOrder<'_>,
) {
    assert!(matches!(
        Scratchpad::new(gpu, per_thread),
        Err(Error::PerThreadStream)
    ));
    let config = ScratchpadConfig {
        pinned_release: Some(per_thread),
        ..ScratchpadConfig::default()
    };
    assert!(matches!(
        Scratchpad::with_config(gpu, device, config),
        Err(Error::PerThreadStream)
    ));
}

/// A scratchpad on `device` whose pinned blocks are released in the order
/// `pinned` (`pinned_release`).
#[track_caller]
pub(crate) fn releasing_pinned_in<'b>(
    gpu: &'b MockBackend,
    device: AccessOrder<'b>,
    pinned: AccessOrder<'b>,
) -> Scratchpad<'b, MockBackend> {
    let config = ScratchpadConfig {
        pinned_release: Some(pinned),
        ..ScratchpadConfig::default()
    };
    Scratchpad::with_config(gpu, device, config).unwrap()
}

/// The mock's stream pool.
type Streams = StreamPool<MockBackend>;
/// The mock's event pool.
type Events = EventPool<MockBackend>;
/// A lease of the mock's stream pool.
type Lease<'p> = StreamLease<'p, MockBackend>;

/// Takes a lease and makes it wait on `origin` (the fork: it joins
/// `origin`'s capture).
#[track_caller]
pub(crate) fn forked<'p>(streams: &'p Streams, origin: &Lease, events: &Events) -> Lease<'p> {
    let side = streams.get(0).unwrap();
    side.order().wait(&origin.order(), events).unwrap();
    side
}

/// Makes `origin` wait on `side` (the join: the capture takes `side`'s work
/// back).
#[track_caller]
pub(crate) fn join(origin: &Lease, side: &Lease, events: &Events) {
    origin.order().wait(&side.order(), events).unwrap();
}

/// A side lease forked into `origin`'s capture ([`forked`]) and joined back
/// at once ([`join`]), with no work of its own.
#[track_caller]
pub(crate) fn forked_and_joined<'p>(
    streams: &'p Streams,
    origin: &Lease,
    events: &Events,
) -> Lease<'p> {
    let side = forked(streams, origin, events);
    join(origin, &side, events);
    side
}

/// Takes a lease of device 0 and queues one piece of work on its stream
/// (`enqueue_work`): a lease whose stream is busy.
#[track_caller]
pub(crate) fn busy_lease<'p>(gpu: &MockBackend, streams: &'p Streams) -> Lease<'p> {
    let lease = streams.get(0).unwrap();
    gpu.enqueue_work(lease.handle()).unwrap();
    lease
}

/// The host writes `value` to every element of the pinned slice `p`.
fn write_all<T: Copy>(p: &mut [MaybeUninit<T>], value: T) {
    p.iter_mut().for_each(|v| {
        v.write(value);
    });
}

/// The host writes `value` to every element of the pinned slice `p`, then
/// `stream` reads its first `len` bytes (`use_memory`: a kernel, or a graph
/// node when `stream` is capturing).
#[track_caller]
pub(crate) fn fill_and_use<T: Copy>(
    gpu: &MockBackend,
    stream: StreamHandle,
    p: &mut [MaybeUninit<T>],
    value: T,
    len: usize,
) {
    write_all(p, value);
    gpu.use_memory(stream, p.as_ptr().cast(), len).unwrap();
}

/// The host writes `value` to every element of the pinned slice `p`, as the
/// mock sees it: a host access to its first `len` bytes (`host_access`).
#[track_caller]
pub(crate) fn fill_on_host<T: Copy>(
    gpu: &MockBackend,
    p: &mut [MaybeUninit<T>],
    value: T,
    len: usize,
) {
    write_all(p, value);
    gpu.host_access(p.as_ptr().cast(), len).unwrap();
}

/// `value`, leaked: a `'static` reference, such as a process-wide hook can
/// be armed with.
pub(crate) fn leak<T: 'static>(value: T) -> &'static T {
    Box::leak(Box::new(value))
}

/// Takes what a lost-error hook's slot holds if it was armed on this thread
/// (`thread` reads that thread from it); `None` otherwise: other tests' lost
/// errors may reach the hook on their own threads.
pub(crate) fn take_armed_here<T>(
    slot: &Mutex<Option<T>>,
    thread: impl Fn(&T) -> std::thread::ThreadId,
) -> Option<T> {
    let mut armed = slot.lock().unwrap_or_else(|e| e.into_inner());
    armed.take_if(|a| thread(a) == std::thread::current().id())
}

/// Runs `f` with `hook` as the process-wide lost-error hook, then puts the
/// previous hook back.
pub(crate) fn with_lost_error_hook<R>(
    hook: fn(&dyn core::fmt::Display),
    f: impl FnOnce() -> R,
) -> R {
    let previous = set_lost_error_hook(Some(hook));
    let out = f();
    set_lost_error_hook(previous);
    out
}

/// Uploads `data` with `scratch` and queues, in `order`, a kernel that adds
/// one to each element in place; returns the device slice.
#[track_caller]
pub(crate) fn upload_and_increment<'s>(
    gpu: &MockBackend,
    scratch: &'s Scratchpad<'_, MockBackend>,
    order: AccessOrder<'_>,
    data: &[u32],
) -> DeviceSlice<'s, u32> {
    let x = scratch.to_device(data).unwrap();
    gpu.launch_map(&order, &x, &x, |v| v + 1).unwrap();
    x
}

/// Takes `len` bytes of device memory from `scratch` and queues, in `order`,
/// a kernel that writes them in place (`launch_map`); returns the device
/// slice.
#[track_caller]
pub(crate) fn allocate_and_write<'s>(
    gpu: &MockBackend,
    scratch: &'s Scratchpad<'_, MockBackend>,
    order: AccessOrder<'_>,
    len: usize,
) -> DeviceSlice<'s, u8> {
    let x = scratch.device::<u8>(len).unwrap();
    gpu.launch_map(&order, &x, &x, |v| v).unwrap();
    x
}

/// A scratchpad on `origin`'s order, then a capture begun on `origin` in
/// `mode`: the scratchpad's round began outside the capture and goes on
/// inside it.
#[track_caller]
pub(crate) fn scratchpad_then_capture<'b>(
    gpu: &'b MockBackend,
    origin: &'b Lease,
    mode: CaptureMode,
) -> Scratchpad<'b, MockBackend> {
    let scratch = Scratchpad::new(gpu, origin.order()).unwrap();
    origin.begin_capture(mode).unwrap();
    scratch
}

/// Asserts that `waited` (a wait issued during the capture on `origin`) was
/// refused, and that the capture was still active after it and ends well;
/// then that the mock is clean. Ends the capture.
#[track_caller]
pub(crate) fn assert_refused_and_the_capture_intact(
    gpu: &MockBackend,
    origin: &StreamLease<'_, MockBackend>,
    waited: Result<(), Error<MockError>>,
) {
    let status = gpu.capture_status_of(origin.handle());
    let ended = origin.end_capture();
    assert!(waited.is_err());
    assert_eq!(status, Ok(CaptureStatus::Active), "{waited:?}");
    assert!(ended.is_ok(), "{ended:?}");
    gpupool_tests::assert_clean(gpu);
}

/// A race: `there` runs on a scoped thread and `here` on this one, both
/// released at once by a barrier; what each returned comes back.
pub(crate) fn race<T: Send, R>(
    there: impl FnOnce() -> T + Send,
    here: impl FnOnce() -> R,
) -> (T, R) {
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        let there = s.spawn(|| {
            barrier.wait();
            there()
        });
        barrier.wait();
        let here = here();
        (there.join().unwrap(), here)
    })
}

/// Runs `round` (given its number) up to `rounds` times, until one leaves a
/// hazard on `gpu`, then asserts that none did (`what` names the harm). A
/// round that returns `false` proved nothing (the race went the other way):
/// its hazards are cleared and the next round runs.
#[track_caller]
pub(crate) fn assert_no_hazard_in_rounds(
    gpu: &MockBackend,
    rounds: usize,
    what: &str,
    mut round: impl FnMut(usize) -> bool,
) {
    let mut hit = None;
    for n in 0..rounds {
        if !round(n) {
            gpu.clear_hazards();
            continue;
        }
        if !gpu.hazards().is_empty() {
            hit = Some(n);
            break;
        }
    }
    assert_eq!(hit, None, "{what} in round {hit:?}: {:?}", gpu.hazards());
}

/// Contention on the mock's lock until `done` is set: work queued on
/// `noise` and completed, again and again (widens the gaps of a race run on
/// other threads). Yields between turns: where the racing threads have no
/// core of their own (CI's other jobs), they still run.
pub(crate) fn lock_noise(gpu: &MockBackend, noise: StreamHandle, done: &AtomicBool) {
    while !done.load(Ordering::Relaxed) {
        gpu.enqueue_work(noise).unwrap();
        gpu.complete_all(noise).unwrap();
        std::thread::yield_now();
    }
}

/// Completes every piece of work the mock holds, then asserts that nothing
/// was misused and no hazard was found (`assert_clean`).
#[track_caller]
pub(crate) fn complete_and_assert_clean(gpu: &MockBackend) {
    gpu.complete_everything();
    gpupool_tests::assert_clean(gpu);
}

/// Completes everything, drops `things` (a tuple drops its fields first to
/// last, as `drop` calls one a line would), then completes and asserts clean
/// ([`complete_and_assert_clean`]).
#[track_caller]
pub(crate) fn complete_drop_and_assert_clean<T>(gpu: &MockBackend, things: T) {
    gpu.complete_everything();
    drop_complete_and_assert_clean(gpu, things);
}

/// Drops `things` (first to last), then completes and asserts clean
/// ([`complete_and_assert_clean`]).
#[track_caller]
pub(crate) fn drop_complete_and_assert_clean<T>(gpu: &MockBackend, things: T) {
    drop(things);
    complete_and_assert_clean(gpu);
}

/// Drops `things` (first to last), completes everything, then asserts that
/// no block is left and that the mock is clean (`assert_clean`).
#[track_caller]
pub(crate) fn drop_and_assert_all_freed<T>(gpu: &MockBackend, things: T) {
    drop(things);
    gpu.complete_everything();
    assert_eq!(gpu.live_blocks(), 0);
    gpupool_tests::assert_clean(gpu);
}

/// Completes everything, then asserts that the mock found no hazard (the
/// misuses are not looked at).
#[track_caller]
pub(crate) fn complete_and_assert_no_hazards(gpu: &MockBackend) {
    gpu.complete_everything();
    assert!(gpu.hazards().is_empty(), "{:?}", gpu.hazards());
}
