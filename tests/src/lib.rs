//! gpupool's acceptance suite: the machine the tests run on, and helpers shared
//! by the test files in `tests/`.
//!
//! The suite is written against the backend traits and a small [`TestGpu`]
//! interface for what a test needs to steer beyond them (making a stream busy,
//! finishing its work, counting live handles where the machine can count).
//!
//! ## The machine of this build
//!
//! [`gpu`] gives the machine the build runs on, as [`Gpu`]:
//! - by default the mock backend, wrapped in [`MockGpu`] so that a generic test
//!   sees only [`TestGpu`] and cannot reach the mock's own API by accident;
//! - with `--features cuda`, a real GPU (`cuda::CudaGpu`).
//!
//! The generic tests (the `suite` binary, `tests/suite/`) use only `gpu()`,
//! [`TestGpu`], the backend traits and the pools' and the scratchpad's API,
//! so `cargo test -p gpupool-tests` runs them on the mock and
//! `cargo test -p gpupool-tests --features cuda` runs the same tests on a GPU.
//! The other binaries (`mock`, `scratch`, `drop_paths`) are mock-only (fault
//! injection, call counting by kind, misuse and hazard detection) and are
//! compiled out under `--features cuda` (all but the `soundness` tests, which
//! need only the mock), so a CUDA run holds only tests that ran on the GPU.
//!
//! ## On the GPU machine
//!
//! It has no Rust toolchain: build the test executables here with
//! `scripts/build-gpu-binaries.sh --with-suite` (into `.gpu/`), then run
//! `bash scripts/gpu-check.sh` there, which runs every `.gpu/test-*` with
//! `--include-ignored --test-threads=1`. Tests that need two GPUs print
//! "skipped: needs 2 GPUs" and pass on one.
//!
//! Without a CUDA driver or GPU, `gpu()` under `--features cuda` panics with
//! "no CUDA driver" (or "no CUDA GPU"): a GPU run that silently skipped
//! everything would look like a pass. Set [`SKIP_WITHOUT_GPU`]`=1` to skip
//! instead (each test then prints why and passes).

use gpupool_core::{
    Backend, DeviceId, EventBackend, EventFlags, EventHandle, EventPool, Scratchpad, StreamBackend,
    StreamHandle, StreamPool,
};
use gpupool_mock::MockBackend;

pub mod any_pool;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod wake;

/// The environment variable that turns the `--features cuda` run's "no CUDA
/// driver" / "no CUDA GPU" panic into a skip.
pub const SKIP_WITHOUT_GPU: &str = "GPUPOOL_SKIP_WITHOUT_GPU";

/// What the acceptance tests need from a machine besides the backend traits.
///
/// Two kinds of work can be put on a stream:
/// - *held* work ([`make_busy`](Self::make_busy)) stays pending until the test
///   calls [`finish`](Self::finish) (or [`quiesce`](Self::quiesce)) for that
///   stream, however long that takes;
/// - *free* work ([`submit`](Self::submit)) needs nothing but the stream's
///   earlier work (and the events it waits on): on a GPU it runs by itself; on
///   the mock, which has no time, it runs when a test asks
///   ([`is_held`](Self::is_held), [`finish`](Self::finish),
///   [`quiesce`](Self::quiesce)).
///
/// The harness calls take pooled (created) streams; CUDA's special streams 0,
/// 1 and 2 may be used with the backend traits and `AccessOrder`, but not
/// here (the mock resolves them through its machine-wide current device).
///
/// The calls that take a stream or an event are `unsafe fn`s: on a GPU they
/// hand the handle to the driver, so each has a `# Safety` list, in the terms
/// of [`Backend`]'s handle contracts, for the backend of
/// [`backend`](Self::backend) (every backend value of one machine shares its
/// id). The mock checks every handle and reports a bad one as a misuse (or an
/// error): its implementations are sound for any handle, the GPU machine's
/// are not.
pub trait TestGpu: Clone + Send + Sync + 'static {
    /// The backend the pools are built over.
    type Backend: StreamBackend + EventBackend + Clone + Send + Sync + 'static;

    /// The backend (a cheap handle to the same machine).
    fn backend(&self) -> Self::Backend;

    /// How many devices the machine has.
    fn device_count(&self) -> u32;

    /// Makes `device` the calling thread's current device (the mock has one
    /// current device for the whole machine).
    fn set_current_device(&self, device: DeviceId);

    /// Submits work to `stream` that stays pending until [`finish`](Self::finish).
    ///
    /// # Safety
    /// `stream` is a usable stream of `device` (see [`Backend`]'s handle
    /// contracts) for this machine's backend: created on `device` by a backend
    /// with [`backend`](Self::backend)'s id and not destroyed before the call
    /// returns, or one of the special streams (sound, but see above: tests
    /// pass created ones). The held work may outlive the stream, as CUDA
    /// allows.
    unsafe fn make_busy(&self, stream: StreamHandle, device: DeviceId);

    /// Completes (mock) or lets go of and waits for (GPU) all work submitted
    /// to `stream`, held or free.
    ///
    /// # Safety
    /// As for [`make_busy`](Self::make_busy): `stream` is a usable stream of
    /// `device` for this machine's backend, live until the call returns (or a
    /// special stream).
    unsafe fn finish(&self, stream: StreamHandle, device: DeviceId);

    /// Submits free work to `stream`: it completes by itself once the stream
    /// reaches it (type documentation).
    ///
    /// # Safety
    /// As for [`make_busy`](Self::make_busy): `stream` is a usable stream of
    /// `device` for this machine's backend, live until the call returns (or a
    /// special stream).
    unsafe fn submit(&self, stream: StreamHandle, device: DeviceId);

    /// Lets the free work on `stream` run as far as it can without any held
    /// work finishing, and says whether `stream` is still pending (blocked on
    /// a wait for work that is held, directly or through other streams).
    /// `stream` must hold no held work of its own.
    ///
    /// # Safety
    /// As for [`make_busy`](Self::make_busy): `stream` is a usable stream of
    /// `device` for this machine's backend, live until the call returns (or a
    /// special stream).
    unsafe fn is_held(&self, stream: StreamHandle, device: DeviceId) -> bool;

    /// Finishes all work on the machine, held work included, and returns once
    /// it has finished.
    fn quiesce(&self);

    /// Backend calls made so far on the machine, if the backend counts them.
    fn backend_calls(&self) -> Option<u64> {
        None
    }

    /// Streams alive on the machine, if the backend can count them.
    fn live_streams(&self) -> Option<usize>;

    /// Events alive on the machine, if the backend can count them.
    fn live_events(&self) -> Option<usize>;

    /// Whether `event` was created with timing enabled, if the machine can
    /// tell. May record it (on a stream of its own) and wait for it.
    ///
    /// # Safety
    /// 1. `event` is a usable event of `device` (see [`Backend`]'s handle
    ///    contracts) for this machine's backend: created on `device` by a
    ///    backend with [`backend`](Self::backend)'s id and not destroyed
    ///    before the call returns;
    /// 2. nothing else uses it during the call (no record, query, wait or
    ///    destroy from another thread or a pool), since the call may record
    ///    it.
    unsafe fn event_timing(&self, event: EventHandle, device: DeviceId) -> Option<bool>;

    /// The backend misuses seen so far (bad handles, devices, ...), if the
    /// machine detects them.
    fn misuse_report(&self) -> Option<Vec<String>> {
        None
    }
}

/// The mock as a machine. Its handle-taking methods are `unsafe fn`s only
/// because the trait's are: they are sound for any handle, live, dead or made
/// up, since the mock looks every handle up in its own tables (a bad one is a
/// misuse or an error, which these methods turn into a panic), and never hands
/// it to a driver.
impl TestGpu for MockBackend {
    type Backend = MockBackend;

    fn backend(&self) -> MockBackend {
        self.clone()
    }

    /// Asks the backend, so this is counted as a backend call; [`MockGpu`]
    /// knows its count without asking.
    fn device_count(&self) -> u32 {
        Backend::device_count(self).expect("the mock counts its devices")
    }

    fn set_current_device(&self, device: DeviceId) {
        MockBackend::set_current_device(self, device);
    }

    unsafe fn make_busy(&self, stream: StreamHandle, _device: DeviceId) {
        self.enqueue_work(stream)
            .expect("enqueue work on a live stream");
    }

    unsafe fn finish(&self, stream: StreamHandle, _device: DeviceId) {
        self.complete_all(stream).expect("complete a live stream");
    }

    unsafe fn submit(&self, stream: StreamHandle, _device: DeviceId) {
        self.enqueue_work(stream)
            .expect("enqueue work on a live stream");
    }

    unsafe fn is_held(&self, stream: StreamHandle, _device: DeviceId) -> bool {
        while self
            .complete_one(stream)
            .expect("complete on a live stream")
        {}
        // Not a backend call (a query would be counted): work left behind the
        // front means the stream is blocked on a wait.
        self.pending_work(stream).expect("a live stream") > 0
    }

    fn quiesce(&self) {
        self.complete_everything();
    }

    fn backend_calls(&self) -> Option<u64> {
        Some(self.total_calls())
    }

    fn live_streams(&self) -> Option<usize> {
        Some(MockBackend::live_streams(self))
    }

    fn live_events(&self) -> Option<usize> {
        Some(MockBackend::live_events(self))
    }

    unsafe fn event_timing(&self, event: EventHandle, _device: DeviceId) -> Option<bool> {
        let flags = self.event_flags(event).expect("a live event");
        Some(!flags.contains(EventFlags::DISABLE_TIMING))
    }

    fn misuse_report(&self) -> Option<Vec<String>> {
        Some(self.misuses().iter().map(ToString::to_string).collect())
    }
}

/// The mock as the generic suite's machine: only [`TestGpu`] is visible
/// through it, so a generic test that compiles here compiles on a GPU too.
#[derive(Clone, Debug)]
pub struct MockGpu {
    mock: MockBackend,
    devices: u32,
}

impl MockGpu {
    /// A fresh mock machine with `devices` devices.
    pub fn new(devices: u32) -> Self {
        MockGpu {
            mock: MockBackend::new(devices),
            devices,
        }
    }
}

/// Forwards to the mock's implementation, which is sound for any handle (see
/// `impl TestGpu for MockBackend`); the forwarding `unsafe fn`s pass the
/// caller's guarantees on.
impl TestGpu for MockGpu {
    type Backend = MockBackend;

    fn backend(&self) -> MockBackend {
        self.mock.clone()
    }

    /// Known from construction: no backend call.
    fn device_count(&self) -> u32 {
        self.devices
    }

    fn set_current_device(&self, device: DeviceId) {
        TestGpu::set_current_device(&self.mock, device)
    }

    unsafe fn make_busy(&self, stream: StreamHandle, device: DeviceId) {
        // SAFETY: the caller's guarantees, passed on (the mock needs none).
        unsafe { self.mock.make_busy(stream, device) }
    }

    unsafe fn finish(&self, stream: StreamHandle, device: DeviceId) {
        // SAFETY: the caller's guarantees, passed on (the mock needs none).
        unsafe { self.mock.finish(stream, device) }
    }

    unsafe fn submit(&self, stream: StreamHandle, device: DeviceId) {
        // SAFETY: the caller's guarantees, passed on (the mock needs none).
        unsafe { self.mock.submit(stream, device) }
    }

    unsafe fn is_held(&self, stream: StreamHandle, device: DeviceId) -> bool {
        // SAFETY: the caller's guarantees, passed on (the mock needs none).
        unsafe { self.mock.is_held(stream, device) }
    }

    fn quiesce(&self) {
        self.mock.quiesce()
    }

    fn backend_calls(&self) -> Option<u64> {
        self.mock.backend_calls()
    }

    fn live_streams(&self) -> Option<usize> {
        TestGpu::live_streams(&self.mock)
    }

    fn live_events(&self) -> Option<usize> {
        TestGpu::live_events(&self.mock)
    }

    unsafe fn event_timing(&self, event: EventHandle, device: DeviceId) -> Option<bool> {
        // SAFETY: the caller's guarantees, passed on (the mock needs none).
        unsafe { self.mock.event_timing(event, device) }
    }

    fn misuse_report(&self) -> Option<Vec<String>> {
        self.mock.misuse_report()
    }
}

/// The machine of this build: the mock.
#[cfg(not(feature = "cuda"))]
pub type Gpu = MockGpu;

/// The machine of this build: a real GPU.
#[cfg(feature = "cuda")]
pub type Gpu = cuda::CudaGpu;

/// The machine of this build, if it has at least `devices_needed` devices;
/// `None` (after printing why the test is skipped) if it has fewer.
///
/// The mock has exactly `devices_needed` devices (at least one), so a test
/// that uses more devices than it asks for fails on the mock as well. Under
/// `--features cuda` without a CUDA driver or GPU this panics (see the
/// [crate documentation](crate)).
pub fn gpu(devices_needed: u32) -> Option<Gpu> {
    machine(devices_needed, devices_needed.max(1))
}

/// [`gpu`] for a test that uses every device there is: the mock gets
/// `mock_devices` devices (at least `devices_needed`).
pub fn machine(devices_needed: u32, mock_devices: u32) -> Option<Gpu> {
    #[cfg(not(feature = "cuda"))]
    {
        Some(MockGpu::new(mock_devices.max(devices_needed)))
    }
    #[cfg(feature = "cuda")]
    {
        let _ = mock_devices;
        let count = match cuda::driver_device_count() {
            Ok(0) => return no_gpu("no CUDA GPU: the driver reports none"),
            Ok(n) => n,
            Err(why) => return no_gpu(&why),
        };
        if count < devices_needed {
            skip(&format!(
                "needs {devices_needed} GPUs, the driver reports {count}"
            ));
            return None;
        }
        Some(cuda::CudaGpu::new())
    }
}

/// The backend of the machine of this build.
pub type GpuBackend = <Gpu as TestGpu>::Backend;

/// Runs `test` on the machine of this build ([`gpu`]) with a stream pool
/// over it; skips it where [`gpu`] does.
pub fn with_stream_pool(devices_needed: u32, test: impl FnOnce(Gpu, StreamPool<GpuBackend>)) {
    if let Some(gpu) = gpu(devices_needed) {
        let streams = StreamPool::new(gpu.backend());
        test(gpu, streams);
    }
}

/// Runs `test` on the machine of this build ([`gpu`]) with an event pool
/// over it; skips it where [`gpu`] does.
pub fn with_event_pool(devices_needed: u32, test: impl FnOnce(Gpu, EventPool<GpuBackend>)) {
    if let Some(gpu) = gpu(devices_needed) {
        let events = EventPool::new(gpu.backend());
        test(gpu, events);
    }
}

/// Runs `test` on the machine of this build ([`gpu`]) with a stream pool and
/// an event pool over it; skips it where [`gpu`] does.
pub fn with_pools(
    devices_needed: u32,
    test: impl FnOnce(Gpu, StreamPool<GpuBackend>, EventPool<GpuBackend>),
) {
    with_stream_pool(devices_needed, |gpu, streams| {
        let events = EventPool::new(gpu.backend());
        test(gpu, streams, events);
    });
}

/// Prints that the running test is skipped, and why. Written to the process's
/// stderr directly, not through `eprintln!`, so the test harness does not
/// capture it: a skip shows in the log of a run that passed.
pub fn skip(why: &str) {
    use std::io::Write;
    let thread = std::thread::current();
    let name = thread.name().unwrap_or("test");
    let _ = writeln!(std::io::stderr(), "{name}: skipped: {why}");
}

/// A machine without a usable GPU under `--features cuda`: a panic, or a skip
/// when [`SKIP_WITHOUT_GPU`] is set.
#[cfg(feature = "cuda")]
fn no_gpu(why: &str) -> Option<Gpu> {
    if std::env::var_os(SKIP_WITHOUT_GPU).is_some_and(|v| !v.is_empty() && v != "0") {
        skip(why);
        return None;
    }
    panic!(
        "{why}\nThe `cuda` feature runs the acceptance suite on a GPU; run it on the GPU machine \
         (or set {SKIP_WITHOUT_GPU}=1 to skip every test instead)."
    )
}

/// Asserts that `count` is `expected`, where the machine can count at all
/// (`None` passes: the machine cannot tell).
#[track_caller]
pub fn assert_count(count: Option<usize>, expected: usize, what: &str) {
    if let Some(n) = count {
        assert_eq!(n, expected, "{what}");
    }
}

/// Asserts that exactly `expected` backend calls were made since `since`
/// (a [`TestGpu::backend_calls`] reading), where the machine counts them.
#[track_caller]
pub fn assert_calls<G: TestGpu>(gpu: &G, since: Option<u64>, expected: u64, what: &str) {
    if let (Some(before), Some(now)) = (since, gpu.backend_calls()) {
        assert_eq!(now - before, expected, "backend calls: {what}");
    }
}

/// Checks that work on `consumer` is ordered after the work on `producer`
/// (each a stream and its device) by what `link` does: holds the producer's
/// work, runs `link`, gives the consumer free work, and asserts that the
/// consumer stays pending while the producer's work is held and completes once
/// it is let go.
///
/// # Safety
/// `producer` and `consumer` are each a usable stream of its device for
/// `gpu`'s backend (see [`TestGpu::make_busy`]), from the call until it
/// returns: `link` does not destroy them.
#[track_caller]
pub unsafe fn assert_ordered<G: TestGpu>(
    gpu: &G,
    producer: (StreamHandle, DeviceId),
    consumer: (StreamHandle, DeviceId),
    link: impl FnOnce(),
    what: &str,
) {
    // SAFETY: the caller's contract: the producer's stream is usable on its
    // device for the whole call.
    unsafe { gpu.make_busy(producer.0, producer.1) };
    link();
    // SAFETY: the caller's contract: both streams are still usable on their
    // devices (`link` did not destroy them).
    unsafe { gpu.submit(consumer.0, consumer.1) };
    assert!(
        // SAFETY: see above.
        unsafe { gpu.is_held(consumer.0, consumer.1) },
        "{what}: the consumer ran before the producer's work"
    );
    // SAFETY: see above.
    unsafe { gpu.finish(producer.0, producer.1) };
    assert!(
        // SAFETY: see above.
        !unsafe { gpu.is_held(consumer.0, consumer.1) },
        "{what}: the consumer did not run once the producer's work was done"
    );
}

/// Asserts that the machine saw no misuse, where it detects misuse.
#[track_caller]
pub fn assert_no_misuse<G: TestGpu>(gpu: &G) {
    if let Some(misuses) = gpu.misuse_report() {
        assert!(misuses.is_empty(), "misuses: {misuses:?}");
    }
}

/// The message of `e` and of each of its sources in turn, after asserting
/// that no message repeats its source's and that the alternate form (`{e:#}`),
/// for logs that have only `Display`, prints that chain once, joined by ": ".
#[track_caller]
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut chain = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        chain.push(err.to_string());
        next = err.source();
    }
    for pair in chain.windows(2) {
        assert!(
            !pair[0].contains(&pair[1]),
            "{pair:?}: a message repeats its source"
        );
    }
    assert_eq!(format!("{e:#}"), chain.join(": "), "the alternate form");
    chain
}

/// Asserts that neither pool has a lease out or an error parked, and that the
/// machine saw no misuse (where it detects misuse).
#[track_caller]
pub fn assert_pools_clean<G: TestGpu>(
    gpu: &G,
    streams: &StreamPool<G::Backend>,
    events: &EventPool<G::Backend>,
) {
    assert_eq!(
        streams.live_leases() + events.live_leases(),
        0,
        "leases out"
    );
    assert!(streams.take_error().is_none() && events.take_error().is_none());
    assert_no_misuse(gpu);
}

/// A fresh mock machine with `devices` devices (work stays pending until a test
/// completes it).
pub fn mock(devices: u32) -> MockBackend {
    MockBackend::new(devices)
}

/// A fresh mock machine ([`mock`]) and a stream pool over it.
pub fn mock_stream_pool(devices: u32) -> (MockBackend, StreamPool<MockBackend>) {
    let gpu = mock(devices);
    let streams = StreamPool::new(gpu.clone());
    (gpu, streams)
}

/// A fresh mock machine ([`mock`]) and an event pool over it.
pub fn mock_event_pool(devices: u32) -> (MockBackend, EventPool<MockBackend>) {
    let gpu = mock(devices);
    let events = EventPool::new(gpu.clone());
    (gpu, events)
}

/// No misuse logged and no hazard found on the mock.
#[track_caller]
pub fn assert_clean(gpu: &MockBackend) {
    assert!(gpu.misuses().is_empty(), "misuses: {:?}", gpu.misuses());
    assert!(gpu.hazards().is_empty(), "hazards: {:?}", gpu.hazards());
}

/// A fresh mock machine ([`mock`]), a stream pool and an event pool over it.
pub fn mock_pools(devices: u32) -> (MockBackend, StreamPool<MockBackend>, EventPool<MockBackend>) {
    let (gpu, streams) = mock_stream_pool(devices);
    let events = EventPool::new(gpu.clone());
    (gpu, streams, events)
}

/// A stream made directly on the mock's device 0, not leased from a pool: the
/// scratch tests use it to stay clear of the pools' crossbeam-epoch, so Miri
/// can run them under `-Zmiri-strict-provenance` too. Not destroyed on drop
/// (the mock is dropped with the test). It borrows the mock it was made on, so
/// its [`order`](Self::order) can name that backend.
#[derive(Clone, Copy, Debug)]
pub struct MockStream<'g> {
    gpu: &'g MockBackend,
    stream: StreamHandle,
}

impl<'g> MockStream<'g> {
    /// Creates a stream on device 0 of `gpu`.
    pub fn new(gpu: &'g MockBackend) -> Self {
        MockStream {
            gpu,
            stream: gpu
                .create_stream(DeviceId(0), gpupool_core::StreamOptions::default())
                .expect("the mock creates a stream"),
        }
    }

    /// The raw handle.
    pub fn get(&self) -> StreamHandle {
        self.stream
    }

    /// The stream as an order on device 0.
    pub fn order(&self) -> gpupool_core::AccessOrder<'g> {
        // SAFETY: the stream was created on device 0 by `self.gpu` and this
        // type never destroys it (a test that destroys it by hand does so in
        // an `unsafe` call whose contract says nothing uses it afterwards).
        // Even then nothing unsound follows: the order carries `self.gpu`'s
        // id, so every consumer of orders (waits, scratchpads, kernels)
        // refuses it unless it speaks to this same mock machine, and the
        // mock's trait methods are sound for any handle (a dead one is
        // reported as a misuse or an error); no driver ever sees it.
        unsafe { gpupool_core::AccessOrder::from_raw(self.gpu, self.stream, DeviceId(0)) }
    }
}

/// Runs `test` with a fresh one-device mock ([`mock`]) and a stream of its
/// device 0 ([`MockStream`]).
pub fn with_mock_stream(test: impl for<'g> FnOnce(&'g MockBackend, MockStream<'g>)) {
    let gpu = mock(1);
    test(&gpu, MockStream::new(&gpu));
}

/// Runs `test` with a fresh one-device mock ([`mock`]), a stream of its
/// device 0 ([`MockStream`]) and a scratchpad in that stream's order.
pub fn with_scratchpad(
    test: impl for<'g> FnOnce(&'g MockBackend, MockStream<'g>, Scratchpad<'g, MockBackend>),
) {
    with_mock_stream(|gpu, s| test(gpu, s, Scratchpad::new(gpu, s.order()).unwrap()));
}

/// A small deterministic random number generator (xorshift64*) for workloads;
/// tests need reproducible mixes, not statistical quality.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (0 is replaced by a fixed odd constant).
    pub fn new(seed: u64) -> Self {
        Rng(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// The README's code blocks, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
