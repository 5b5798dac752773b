//! The buffers of one FastRPC call, addressed by protocol buffer ids.
//!
//! Ids are positions: input buffers after the request message get ids
//! `1..`, output buffers after the response message continue the count.
//! Input buffers are read-only; output buffers are readable and writable.
//! Every access goes through [`hexlora_proto::protocol::buffer::validate`].
use super::abi::RemoteBuf;
use hexlora_proto::protocol::buffer::{overlaps, validate};
use hexlora_proto::protocol::{BufferError, BufferRef, RegisteredBuffer};

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
    /// Returns `None` when there are more than [`MAX_SHARED_BUFFERS`].
    ///
    /// # Safety
    /// Every `RemoteBuf` must describe memory valid for reads (inputs) or
    /// reads and writes (outputs) for `'a`, not aliased by anything else, and
    /// the output buffers must not overlap each other or the inputs.
    pub unsafe fn new(inputs: &[RemoteBuf], outputs: &[RemoteBuf]) -> Option<Self> {
        let mut bufs = heapless::Vec::new();
        let mut registered = heapless::Vec::new();
        let all = inputs.iter().map(|b| (*b, false)).chain(outputs.iter().map(|b| (*b, true)));
        for (i, (buf, writable)) in all.enumerate() {
            let id = i as u32 + 1;
            bufs.push((buf, writable)).ok()?;
            registered.push(RegisteredBuffer { id, len: buf.len as u64 }).ok()?;
        }
        Some(SharedBuffers { bufs, registered, _call: core::marker::PhantomData })
    }

    /// Ids and lengths, for validation.
    pub fn registered(&self) -> &[RegisteredBuffer] {
        &self.registered
    }

    /// The bytes `r` names.
    pub fn read(&self, r: &BufferRef) -> Result<&[u8], BufferError> {
        let range = validate(r, &self.registered)?;
        let (buf, _) = self.bufs[r.buffer as usize - 1];
        // SAFETY: validate() put `range` inside the buffer, valid for reads
        // per the contract of `new`.
        Ok(unsafe { core::slice::from_raw_parts((buf.pv as *const u8).add(range.start), range.len()) })
    }

    /// The bytes `r` names, writable; `r` must be in an output buffer.
    pub fn write(&mut self, r: &BufferRef) -> Result<&mut [u8], BufferError> {
        let range = validate(r, &self.registered)?;
        let (buf, writable) = self.bufs[r.buffer as usize - 1];
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
        // SAFETY: the ranges are disjoint (checked above; distinct buffers
        // never overlap per `new`), so the shared and the mutable slice do
        // not alias.
        Ok((unsafe { core::slice::from_raw_parts(ptr, len) }, out))
    }
}
