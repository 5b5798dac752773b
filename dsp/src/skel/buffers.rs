//! The buffers a request can name, addressed by protocol buffer ids.
//!
//! - [`Mapping`]: the session's weights mapping, id
//!   [`WEIGHTS_BUFFER`], registered once per session and read in place;
//! - [`SharedBuffers`]: the buffers of one call. Ids are positions from
//!   [`INPUT_BUFFER`] on: input buffers after the request message first,
//!   output buffers after the response message continue the count. Input
//!   buffers are read-only; output buffers are readable and writable.
//!
//! The host controls every pointer and length here, so [`SharedBuffers::new`]
//! refuses null pointers and output buffers that alias any other buffer of
//! the call or the mapping (by address, across ids), and every access goes
//! through [`hexlora_proto::protocol::buffer::validate`].
use super::abi::RemoteBuf;
use hexlora_proto::protocol::buffer::{overlaps, validate};
use hexlora_proto::protocol::{BufferError, BufferRef, RegisteredBuffer, INPUT_BUFFER, WEIGHTS_BUFFER};

/// The session's weights: host memory mapped into the DSP for the whole
/// session, read where it lies.
#[derive(Clone, Copy, Debug)]
pub struct Mapping {
    buf: RemoteBuf,
}

// SAFETY: the mapping is read-only shared memory that stays mapped for the
// session (the contract of `Mapping::new`); any thread may read it.
unsafe impl Send for Mapping {}

impl Mapping {
    /// The mapping `buf`; `None` for a null pointer or zero length.
    ///
    /// # Safety
    /// `buf` must stay valid for reads until the session that keeps the
    /// mapping closes. The host may still write to it (it is shared memory):
    /// the service checks each weight once at load, and a host that changes
    /// a resident weight afterwards gets wrong numbers, never a fault.
    pub unsafe fn new(buf: RemoteBuf) -> Option<Mapping> {
        (!buf.pv.is_null() && buf.len > 0).then_some(Mapping { buf })
    }

    /// Its registration: id [`WEIGHTS_BUFFER`] and its length.
    pub fn registered(&self) -> RegisteredBuffer {
        RegisteredBuffer { id: WEIGHTS_BUFFER, len: self.buf.len as u64 }
    }

    /// The bytes `r` names (`r.buffer` must be [`WEIGHTS_BUFFER`]).
    pub fn read(&self, r: &BufferRef) -> Result<&[u8], BufferError> {
        let range = validate(r, &[self.registered()])?;
        // SAFETY: validate() put `range` inside the mapping, valid for reads
        // per the contract of `new`.
        Ok(unsafe { core::slice::from_raw_parts((self.buf.pv as *const u8).add(range.start), range.len()) })
    }

    /// The mapped memory.
    pub fn buf(&self) -> RemoteBuf {
        self.buf
    }
}

/// Whether two host buffers share a byte (zero-length buffers share none).
pub fn aliases(a: &RemoteBuf, b: &RemoteBuf) -> bool {
    let (a0, b0) = (a.pv as usize, b.pv as usize);
    a.len > 0 && b.len > 0 && a0 < b0.saturating_add(b.len) && b0 < a0.saturating_add(a.len)
}

/// Most shared buffers one call may carry.
pub const MAX_SHARED_BUFFERS: usize = 16;

/// The shared buffers of one call.
pub struct SharedBuffers<'a> {
    bufs: heapless::Vec<(RemoteBuf, bool), MAX_SHARED_BUFFERS>,
    registered: heapless::Vec<RegisteredBuffer, MAX_SHARED_BUFFERS>,
    _call: core::marker::PhantomData<&'a mut [u8]>,
}

impl<'a> SharedBuffers<'a> {
    /// The buffers of a call: `inputs` read-only, `outputs` writable.
    /// Returns `None` when there are more than [`MAX_SHARED_BUFFERS`], a
    /// buffer with bytes has a null pointer, or an output buffer shares a
    /// byte with any other buffer or with `mapping`.
    ///
    /// # Safety
    /// Every `RemoteBuf` must describe memory valid for reads (inputs) or
    /// reads and writes (outputs) for `'a`, and nothing else may write the
    /// call's buffers while it runs.
    pub unsafe fn new(inputs: &[RemoteBuf], outputs: &[RemoteBuf], mapping: Option<&Mapping>) -> Option<Self> {
        let mut bufs = heapless::Vec::new();
        let mut registered = heapless::Vec::new();
        let all = inputs.iter().map(|b| (*b, false)).chain(outputs.iter().map(|b| (*b, true)));
        for (i, (buf, writable)) in all.enumerate() {
            if buf.pv.is_null() && buf.len > 0 {
                return None;
            }
            bufs.push((buf, writable)).ok()?;
            registered.push(RegisteredBuffer { id: INPUT_BUFFER + i as u32, len: buf.len as u64 }).ok()?;
        }
        for (i, (out, writable)) in bufs.iter().enumerate() {
            let other_aliases = bufs.iter().enumerate().any(|(j, (b, _))| i != j && aliases(out, b));
            if *writable && (other_aliases || mapping.is_some_and(|m| aliases(out, &m.buf))) {
                return None;
            }
        }
        Some(SharedBuffers { bufs, registered, _call: core::marker::PhantomData })
    }

    /// The index into `bufs` of buffer id `id` (validated ids only).
    fn slot(id: u32) -> usize {
        (id - INPUT_BUFFER) as usize
    }

    /// Ids and lengths, for validation.
    pub fn registered(&self) -> &[RegisteredBuffer] {
        &self.registered
    }

    /// The bytes `r` names.
    pub fn read(&self, r: &BufferRef) -> Result<&[u8], BufferError> {
        let range = validate(r, &self.registered)?;
        let (buf, _) = self.bufs[Self::slot(r.buffer)];
        // SAFETY: validate() put `range` inside the buffer, valid for reads
        // per the contract of `new`.
        Ok(unsafe { core::slice::from_raw_parts((buf.pv as *const u8).add(range.start), range.len()) })
    }

    /// The bytes `r` names, writable; `r` must be in an output buffer.
    pub fn write(&mut self, r: &BufferRef) -> Result<&mut [u8], BufferError> {
        let range = validate(r, &self.registered)?;
        let (buf, writable) = self.bufs[Self::slot(r.buffer)];
        if !writable {
            return Err(BufferError::ReadOnly { buffer: r.buffer });
        }
        // SAFETY: as in read(), plus writable per the contract of `new`;
        // `&mut self` keeps this the only live slice.
        Ok(unsafe { core::slice::from_raw_parts_mut((buf.pv as *mut u8).add(range.start), range.len()) })
    }

    /// An op's input (read) and output (written) at once; they must not
    /// overlap.
    pub fn input_output(&mut self, input: &BufferRef, output: &BufferRef) -> Result<(&[u8], &mut [u8]), BufferError> {
        if overlaps(input, output) {
            return Err(BufferError::Overlap { buffer: input.buffer });
        }
        let inp = self.read(input)?;
        let (ptr, len) = (inp.as_ptr(), inp.len());
        let out = self.write(output)?;
        // SAFETY: the ranges are disjoint (checked above; an output buffer
        // overlaps no other buffer, checked in `new`), so the shared and the
        // mutable slice do not alias.
        Ok((unsafe { core::slice::from_raw_parts(ptr, len) }, out))
    }
}
