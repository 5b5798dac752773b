//! The firmware's log, decoded on the host.
//!
//! The DSP firmware logs with defmt: a log call sends only an index into a
//! string table plus the raw arguments, and the table stays in the firmware
//! ELF's `.defmt` section. [`FirmwareLog`] reads that table from the ELF and
//! turns the bytes of the firmware's log ring (`hexlora_dsp::rt::log_ring`)
//! back into text. The simulator self-test binary prints the ring as one
//! `defmt-log <hex>` line when run with `--dump-log` ([`parse_ring_dump`]).
use crate::{Error, Result};
use defmt_decoder::{DecodeError, Table};
use std::path::Path;

/// One decoded log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    /// `INFO`, `ERROR`, ... (`None` for `println!`).
    pub level: Option<String>,
    /// The formatted message.
    pub message: String,
}

/// The string table of one firmware build.
pub struct FirmwareLog {
    table: Table,
}

impl FirmwareLog {
    /// Reads the defmt table from the firmware ELF at `elf`.
    pub fn from_elf(elf: &Path) -> Result<FirmwareLog> {
        let bytes = std::fs::read(elf).map_err(|e| Error::io(elf, e))?;
        let what = || elf.display().to_string();
        let table = Table::parse(&bytes)
            .map_err(|e| Error::format(what(), format!("defmt table: {e}")))?
            .ok_or_else(|| Error::format(what(), "no .defmt section: not a defmt firmware build"))?;
        Ok(FirmwareLog { table })
    }

    /// Decodes the log-ring bytes into lines. Bytes after the last complete
    /// frame are ignored (the ring only holds whole frames, so there are
    /// none unless the dump was cut); a frame that does not match the table
    /// is an error naming its position.
    pub fn decode(&self, ring: &[u8]) -> Result<Vec<LogLine>> {
        let mut decoder = self.table.new_stream_decoder();
        decoder.received(ring);
        let mut lines = Vec::new();
        loop {
            match decoder.decode() {
                Ok(frame) => lines.push(LogLine {
                    level: frame.level().map(|l| l.as_str().to_uppercase()),
                    message: frame.display_message().to_string(),
                }),
                Err(DecodeError::UnexpectedEof) => return Ok(lines),
                Err(DecodeError::Malformed) => {
                    return Err(Error::format(
                        "firmware log",
                        format!("frame {} does not match the firmware's defmt table (wrong ELF?)", lines.len()),
                    ))
                }
            }
        }
    }
}

/// Extracts the ring bytes from the simulator's output (the line
/// `defmt-log <hex>`).
pub fn parse_ring_dump(stdout: &str) -> Result<Vec<u8>> {
    let hex = stdout
        .lines()
        .find_map(|l| l.strip_prefix("defmt-log"))
        .ok_or_else(|| Error::format("simulator output", "no `defmt-log` line (run with --dump-log)"))?
        .trim();
    if hex.len() % 2 != 0 {
        return Err(Error::format("defmt-log line", format!("odd number of hex digits ({})", hex.len())));
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&hex[i..i + 2], 16)
                .map_err(|_| Error::format("defmt-log line", format!("`{}` at {i} is not hex", &hex[i..i + 2])))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_dump_is_parsed_from_simulator_output() {
        let out = "test a ... ok\n1 passed, 0 failed\ndefmt-log 00ff1a\ndefmt-dropped 0\n";
        assert_eq!(parse_ring_dump(out).unwrap(), vec![0x00, 0xff, 0x1a]);
        assert_eq!(parse_ring_dump("defmt-log \n").unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn bad_dumps_are_errors_that_say_why() {
        let missing = parse_ring_dump("1 passed, 0 failed\n").unwrap_err().to_string();
        assert!(missing.contains("no `defmt-log` line"), "{missing}");
        let odd = parse_ring_dump("defmt-log abc\n").unwrap_err().to_string();
        assert!(odd.contains("odd number"), "{odd}");
        let not_hex = parse_ring_dump("defmt-log zz\n").unwrap_err().to_string();
        assert!(not_hex.contains("`zz` at 0 is not hex"), "{not_hex}");
    }

    #[test]
    fn an_elf_without_defmt_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not-firmware");
        std::fs::write(&path, b"\x7fELF garbage").unwrap();
        let err = FirmwareLog::from_elf(&path).err().expect("garbage ELF accepted").to_string();
        assert!(err.contains("not-firmware"), "{err}");
    }
}
