//! Reading objects ahead, on a thread of their own.
//!
//! Reading an object's symbols and DWARF line table is the expensive part
//! of symbolization (libc's separate debug file alone takes tens of
//! milliseconds to inflate and walk). A profiler learns which objects it
//! will need long before it symbolizes anything: as soon as the client
//! runs code from them. [`Preloader`] reads them then, on one background
//! thread, while the client runs; at the end the symbolizer takes the
//! result, waiting only for a read still under way. An object whose read
//! has not started by then is read by the caller itself (the queue may be
//! long; it should not wait behind objects it does not need yet).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;

use crate::elf::ObjectData;

/// Where one requested object stands.
enum Slot {
    /// Waiting in the queue.
    Queued,
    /// Being read by the background thread.
    Reading,
    /// Read (`None` when it cannot be read, is not ELF, ...).
    Done(Option<ObjectData>),
    /// Handed to the symbolizer, or claimed by it before the background
    /// thread started on it: the background thread skips it.
    Taken,
}

#[derive(Default)]
struct Shared {
    slots: Mutex<HashMap<PathBuf, Slot>>,
    done: Condvar,
}

/// Reads objects on a background thread ahead of their use.
pub struct Preloader {
    queue: Sender<PathBuf>,
    shared: Arc<Shared>,
}

/// What [`Preloader::take`] found.
pub enum Preloaded {
    /// The object was read ahead (`None`: it could not be read).
    Read(Option<ObjectData>),
    /// It was never requested, or the caller should read it itself.
    NotRead,
}

impl Preloader {
    /// Starts the background thread; `None` if the system refuses one
    /// (objects are then read when needed, as without a preloader).
    pub fn start() -> Option<Preloader> {
        let (queue, jobs) = channel::<PathBuf>();
        let shared = Arc::new(Shared::default());
        let worker = Arc::clone(&shared);
        thread::Builder::new()
            .name("symbols-preload".into())
            .spawn(move || {
                for path in jobs {
                    {
                        let mut slots = lock(&worker.slots);
                        match slots.get_mut(&path) {
                            Some(slot @ Slot::Queued) => *slot = Slot::Reading,
                            _ => continue,
                        }
                    }
                    let data = crate::shared::read(&path);
                    lock(&worker.slots).insert(path, Slot::Done(data));
                    worker.done.notify_all();
                }
            })
            .ok()?;
        Some(Preloader { queue, shared })
    }

    /// Asks for `path` to be read ahead; a path already asked for is
    /// ignored.
    pub fn request(&self, path: &Path) {
        let mut slots = lock(&self.shared.slots);
        if slots.contains_key(path) {
            return;
        }
        slots.insert(path.to_path_buf(), Slot::Queued);
        drop(slots);
        if self.queue.send(path.to_path_buf()).is_err() {
            // The thread is gone: the caller reads it.
            lock(&self.shared.slots).insert(path.to_path_buf(), Slot::Taken);
        }
    }

    /// The object read ahead for `path`, waiting if it is being read.
    pub fn take(&self, path: &Path) -> Preloaded {
        let mut slots = lock(&self.shared.slots);
        loop {
            match slots.get_mut(path) {
                None | Some(Slot::Taken) => return Preloaded::NotRead,
                Some(slot @ Slot::Queued) => {
                    *slot = Slot::Taken;
                    return Preloaded::NotRead;
                }
                Some(Slot::Reading) => {
                    slots = self
                        .shared
                        .done
                        .wait(slots)
                        .unwrap_or_else(|p| p.into_inner())
                }
                Some(slot @ Slot::Done(_)) => {
                    let Slot::Done(data) = std::mem::replace(slot, Slot::Taken) else {
                        unreachable!("matched Done above")
                    };
                    return Preloaded::Read(data);
                }
            }
        }
    }
}

impl Preloader {
    /// Whether the background thread has finished with `path` (tests wait
    /// for it so that they exercise the read-ahead path).
    #[cfg(test)]
    fn finished(&self, path: &Path) -> bool {
        matches!(lock(&self.shared.slots).get(path), Some(Slot::Done(_)))
    }
}

/// Locks the slots; a panic on the other thread (which would poison the
/// lock) leaves the map consistent, since every update is one insert.
fn lock(m: &Mutex<HashMap<PathBuf, Slot>>) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Slot>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn this_exe() -> PathBuf {
        std::env::current_exe().unwrap()
    }

    #[test]
    fn an_object_read_ahead_is_the_object_read_in_place() {
        let p = Preloader::start().unwrap();
        let exe = this_exe();
        p.request(&exe);
        p.request(&exe);
        while !p.finished(&exe) {
            thread::sleep(std::time::Duration::from_millis(5));
        }
        let Preloaded::Read(Some(ahead)) = p.take(&exe) else {
            panic!("the executable was requested and is readable")
        };
        let ahead = crate::ObjectInfo::from(ahead);
        let direct = crate::ObjectInfo::load(&exe).unwrap();
        // Same tables: the same answers across the test binary's code.
        let mut named = 0;
        for svma in (0..32u64 << 20).step_by(64) {
            assert_eq!(ahead.raw_function_at(svma), direct.raw_function_at(svma));
            assert_eq!(ahead.line_at(svma), direct.line_at(svma));
            named += usize::from(direct.line_at(svma).is_some());
        }
        assert!(named > 1000, "the test binary has line tables");
        // Taken once: a second take finds nothing.
        assert!(matches!(p.take(&exe), Preloaded::NotRead));
    }

    #[test]
    fn unrequested_and_unreadable_objects() {
        let p = Preloader::start().unwrap();
        assert!(matches!(
            p.take(Path::new("/nonexistent")),
            Preloaded::NotRead
        ));
        p.request(Path::new("/nonexistent/x.so"));
        // Either the thread read it (and failed) or the caller claims it.
        match p.take(Path::new("/nonexistent/x.so")) {
            Preloaded::Read(None) | Preloaded::NotRead => {}
            Preloaded::Read(Some(_)) => panic!("a missing file cannot be read"),
        }
    }
}
