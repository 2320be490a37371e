//! Trace mode in one address space: block ids and flush sites handed out
//! at translation, thread areas' buffer pointers, and the hand-over of
//! complete records to the consumer when a buffer fills or a thread ends.

use super::Space;
use crate::layout::{AREA_TRACE, S_TRACE_LIMIT, S_TRACE_PTR, TRACE_BYTES, TRACE_SLACK};
use crate::stream::StreamLink;
use crate::translate::{FlushSite, TraceMode};
use crate::EngineError;

/// What an address space in trace mode keeps.
#[derive(Clone)]
pub(crate) struct Tracing {
    /// What blocks record.
    pub mode: TraceMode,
    /// The consumer, and this process's key there.
    pub link: StreamLink,
    /// The next block id.
    pub next_block: u32,
    /// The next flush site's number.
    pub next_site: u32,
    /// Flush sites by number.
    pub sites: Vec<FlushSite>,
}

impl Tracing {
    /// Trace mode for a new process image, linked to the consumer.
    pub fn new(mode: TraceMode, link: StreamLink) -> Tracing {
        Tracing {
            mode,
            link,
            next_block: 0,
            next_site: 0,
            sites: Vec::new(),
        }
    }
}

impl Space {
    /// Trace mode: blocks translated from now on write records.
    pub fn set_tracing(&mut self, tracing: Tracing) {
        self.tracing = Some(tracing);
    }

    /// The process image goes away without a profile (exec): its tool
    /// is dropped.
    pub fn discard_trace(&self) {
        if let Some(t) = &self.tracing {
            t.link.discard();
        }
    }

    /// Points the trace buffer of the thread area `area` at its start.
    pub(super) fn reset_trace(&mut self, area: u64) {
        if self.tracing.is_some() {
            let start = area + AREA_TRACE;
            let mut b = start.to_le_bytes().to_vec();
            b.extend_from_slice(&(start + TRACE_BYTES).to_le_bytes());
            const _: () = assert!(S_TRACE_LIMIT == S_TRACE_PTR + 8);
            self.mem.write(area + u64::from(S_TRACE_PTR), &b);
        }
    }

    /// The flush site numbered `site`.
    pub fn flush_site(&self, site: u32) -> Option<FlushSite> {
        self.tracing.as_ref()?.sites.get(site as usize).copied()
    }

    /// A flush stop of the thread whose area is `area`, in a block whose
    /// record is at `record`: hands the records before it to the consumer,
    /// moves the block's own (partly written) record and whatever followed
    /// it to the buffer's start, and returns the record's new address.
    pub fn flush_trace(&mut self, area: u64, record: u64) -> Result<u64, EngineError> {
        let start = area + AREA_TRACE;
        let ptr = self.mem.read_u64(area + u64::from(S_TRACE_PTR))?;
        let end = start + TRACE_BYTES + TRACE_SLACK;
        if !(start..=ptr).contains(&record) || ptr > end {
            return Err(EngineError(format!(
                "trace buffer of thread area {area:#x} is corrupt (record {record:#x}, end {ptr:#x})"
            )));
        }
        let Some(t) = &self.tracing else {
            return Ok(record);
        };
        let mut done = t.link.buffer(((record - start) / 8) as usize);
        self.mem
            .read_into(start, bytemuck::cast_slice_mut(&mut done))?;
        let open = self.mem.read(record, (ptr - record) as usize)?;
        self.mem.write(start, &open);
        let new_ptr = start + open.len() as u64;
        self.mem
            .write(area + u64::from(S_TRACE_PTR), &new_ptr.to_le_bytes());
        t.link.records(area, done);
        Ok(start)
    }

    /// A thread ends (or the process does): its complete records go to the
    /// consumer and its buffer starts over.
    pub(super) fn drain_trace(&mut self, area: u64) {
        let Some(t) = &self.tracing else { return };
        let link = t.link.clone();
        let start = area + AREA_TRACE;
        let Ok(ptr) = self.mem.read_u64(area + u64::from(S_TRACE_PTR)) else {
            return;
        };
        if (start..=start + TRACE_BYTES + TRACE_SLACK).contains(&ptr) {
            let mut words = link.buffer(((ptr - start) / 8) as usize);
            if self
                .mem
                .read_into(start, bytemuck::cast_slice_mut(&mut words))
                .is_ok()
            {
                link.records(area, words);
            }
        }
        link.thread_end(area);
        self.reset_trace(area);
    }
}
