//! The calls that move or touch bytes: `copy_async`, the device-range check
//! of a kernel's arguments, simulated kernels and host accesses.

use super::*;

impl State {
    /// `copy_async`'s checks and work item; the caller copies the bytes if
    /// this returns `Ok(true)`. On a capturing stream the copy is an item of
    /// the capture, and nothing is copied (`Ok(false)`).
    pub(crate) fn copy_async(
        &mut self,
        dst: usize,
        src: usize,
        size: usize,
        stream: StreamHandle,
        device: DeviceId,
    ) -> Result<bool, MockError> {
        let key = self.stream_key(stream, device)?;
        let capture = self.captures.of_stream(key);
        if size == 0 {
            match capture {
                Some(id) => self.capture_item(id, key, Vec::new()),
                None => {
                    self.streams.settle(self.policy);
                    self.push_use(key, &[]);
                }
            }
            return Ok(capture.is_none());
        }
        let bad = |addr| MockError::InvalidRange { addr, len: size };
        // Freed memory and a graph's memory are refused before anything
        // else: nothing is read or written.
        let who = Toucher::Work {
            stream: key,
            graph: capture,
        };
        match self.touchable(dst, size, who)? {
            Some(Place::Inside(_)) => {}
            Some(Place::Foreign) => {
                return Err(MockError::UntrackedDestination {
                    addr: dst,
                    len: size,
                })
            }
            _ => return Err(bad(dst)),
        }
        let src_tracked = match self.touchable(src, size, who)? {
            Some(Place::Inside(_)) => true,
            Some(Place::Foreign) => false,
            _ => return Err(bad(src)),
        };
        if dst < src + size && src < dst + size {
            return Err(MockError::OverlappingCopy {
                dst,
                src,
                len: size,
            });
        }
        if let Some(id) = capture {
            let mut uses = vec![NodeUse {
                addr: dst,
                len: size,
                write: true,
            }];
            if src_tracked {
                uses.push(NodeUse {
                    addr: src,
                    len: size,
                    write: false,
                });
            }
            self.capture_item(id, key, uses);
            return Ok(false);
        }
        self.streams.settle(self.policy);
        let frontier = self.streams.frontier(self.streams.head(key));
        let dst_block = self.check_work_use(key, &frontier, dst, size, true, None);
        let src_block = match src_tracked {
            true => self.check_work_use(key, &frontier, src, size, false, None),
            false => None,
        };
        self.push_use(
            key,
            &[(dst_block, dst, size, true), (src_block, src, size, false)],
        );
        Ok(true)
    }

    /// `Ok` if `[addr, addr + len)` lies inside one live block of device
    /// memory of `device` (an empty range always does) that a simulated
    /// kernel on `key`, a stream of `device`, may touch. A range it may not
    /// touch at all ([`touchable`](Self::touchable)), or not inside a live
    /// block (its block freed: the slice is this machine's), is recorded
    /// as a hazard of `key` too.
    pub(crate) fn check_device_range(
        &mut self,
        key: StreamKey,
        addr: usize,
        len: usize,
        device: DeviceId,
    ) -> Result<(), MockError> {
        if len == 0 {
            return Ok(());
        }
        let who = self.work_on(key);
        let block = match self.touchable_recorded(addr, len, who)? {
            Some(Place::Inside(start)) => self.memory.blocks.get(&start),
            other => {
                let h = hazard(misplaced(other), addr, len, Some(key), None);
                self.memory.hazards.push(h);
                return Err(MockError::NotDeviceMemory { addr, len });
            }
        };
        match block {
            Some(b) if b.kind == MemoryKind::Device && b.device == device => Ok(()),
            Some(b) if b.kind == MemoryKind::Device => Err(MockError::CrossDevice {
                given: device,
                actual: b.device,
            }),
            _ => Err(MockError::NotDeviceMemory { addr, len }),
        }
    }

    /// A simulated kernel's work item on `key`: it reads `src` and writes
    /// `dst` (each `(addr, len)`, checked by `check_device_range`) until it
    /// completes. Records hazards as `copy_async` does. On a capturing
    /// stream, an item of the capture instead.
    pub(crate) fn kernel_use(&mut self, key: StreamKey, src: (usize, usize), dst: (usize, usize)) {
        if let Some(id) = self.captures.of_stream(key) {
            let uses = vec![
                NodeUse {
                    addr: dst.0,
                    len: dst.1,
                    write: true,
                },
                NodeUse {
                    addr: src.0,
                    len: src.1,
                    write: false,
                },
            ];
            self.capture_item(id, key, uses);
            return;
        }
        self.streams.settle(self.policy);
        let frontier = self.streams.frontier(self.streams.head(key));
        let mut ranges = [(None, dst.0, dst.1, true), (None, src.0, src.1, false)];
        for r in &mut ranges {
            if r.2 > 0 {
                r.0 = self.check_work_use(key, &frontier, r.1, r.2, r.3, None);
            }
        }
        self.push_use(key, &ranges);
    }

    /// [`MockBackend::host_access`](crate::MockBackend::host_access):
    /// refused (and recorded) for a range the host may not touch at all,
    /// else a hazard is recorded for whatever else is wrong.
    pub(crate) fn host_access(&mut self, addr: usize, len: usize) -> Result<(), MockError> {
        if len == 0 {
            return Ok(());
        }
        self.streams.settle(self.policy);
        let found = match self.touchable_recorded(addr, len, Toucher::Host)? {
            Some(Place::Inside(start)) => {
                let streams = &self.streams;
                let Some(block) = self.memory.blocks.get_mut(&start) else {
                    return Ok(());
                };
                block.prune(streams);
                if block.kind == MemoryKind::Device {
                    Some((HazardKind::HostAccessToDevice, None))
                } else {
                    block
                        .uses
                        .iter()
                        .find(|u| u.overlaps(addr, len))
                        .map(|u| (HazardKind::HostAccessWhileInUse, Some(u.at.stream)))
                }
            }
            other => Some((misplaced(other), None)),
        };
        if let Some((kind, conflict)) = found {
            let h = hazard(kind, addr, len, None, conflict);
            self.memory.hazards.push(h);
        }
        Ok(())
    }
}
