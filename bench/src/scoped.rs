//! Threads started together in one scope and joined in order: the shape of
//! every multi-thread measurement here (one thread per stream, or per index).

/// Runs `f(item)` for each of `items` on a thread of its own (all started,
/// in order, in one scope), and `meanwhile` on this thread once every one is
/// started; then joins them. Returns their results in `items`' order. A
/// thread that panics panics here, as `what` ("a scratch thread") panicked.
pub fn on_threads<T: Send, R: Send>(
    items: impl IntoIterator<Item = T>,
    what: &str,
    f: impl Fn(T) -> R + Sync,
    meanwhile: impl FnOnce(),
) -> Vec<R> {
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .into_iter()
            .map(|item| scope.spawn(move || f(item)))
            .collect();
        meanwhile();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("{what} panicked")))
            .collect()
    })
}
