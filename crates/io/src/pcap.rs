//! Classic pcap capture (`--capture FILE.pcap`) and a small reader for tests.
//!
//! Format: the original libpcap file format (not pcapng), microsecond
//! timestamps (magic `0xa1b2c3d4`, native byte order), `LINKTYPE_ETHERNET`
//! (1), snap length 65535. Every tool reads it (tcpdump -r, Wireshark, scapy).
//!
//! Direction: classic pcap has no per-packet direction field, so a captured
//! port writes **two files**: received frames to `<stem>.<ifname>.rx.pcap` and
//! transmitted frames to `<stem>.<ifname>.tx.pcap`, where `FILE.pcap` =
//! `<stem>.pcap` (see [`capture_paths`]). Frames are written as they cross
//! the port: rx after receive (before the engine changes them), tx as
//! handed to the backend (after rewrite).
//!
//! Capturing copies every frame and writes through a buffered file; it is a
//! debugging aid, not for line-rate runs.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use crate::batch::Batch;
use crate::error::IoError;
use crate::port::{BackendKind, Port, PortStats};

/// `LINKTYPE_ETHERNET`.
pub const LINKTYPE_ETHERNET: u32 = 1;
const MAGIC_US: u32 = 0xa1b2_c3d4;
const SNAPLEN: u32 = 65535;

/// Writes frames to a classic pcap stream.
pub struct PcapWriter<W: Write> {
    out: W,
    frames: u64,
}

impl<W: Write> PcapWriter<W> {
    /// Write the global header and return the writer.
    pub fn new(mut out: W) -> Result<Self, IoError> {
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&MAGIC_US.to_ne_bytes());
        h[4..6].copy_from_slice(&2u16.to_ne_bytes()); // version 2.4
        h[6..8].copy_from_slice(&4u16.to_ne_bytes());
        // thiszone = 0, sigfigs = 0
        h[16..20].copy_from_slice(&SNAPLEN.to_ne_bytes());
        h[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_ne_bytes());
        out.write_all(&h)
            .map_err(|e| IoError::file("write(pcap header)", &e))?;
        Ok(Self { out, frames: 0 })
    }

    /// A writer that continues a stream whose global header was already
    /// written (appending to an existing capture file).
    pub fn resume(out: W) -> Self {
        Self { out, frames: 0 }
    }

    /// Append one frame received or sent at `ts_ns` (ns since the Unix epoch).
    /// Frames longer than the snap length are truncated (orig_len kept).
    pub fn write_frame(&mut self, frame: &[u8], ts_ns: u64) -> Result<(), IoError> {
        let incl = frame.len().min(SNAPLEN as usize);
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&((ts_ns / 1_000_000_000) as u32).to_ne_bytes());
        h[4..8].copy_from_slice(&((ts_ns % 1_000_000_000 / 1000) as u32).to_ne_bytes());
        h[8..12].copy_from_slice(&(incl as u32).to_ne_bytes());
        h[12..16].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
        self.out
            .write_all(&h)
            .map_err(|e| IoError::file("write(pcap record)", &e))?;
        self.out
            .write_all(&frame[..incl])
            .map_err(|e| IoError::file("write(pcap record)", &e))?;
        self.frames += 1;
        Ok(())
    }

    /// Frames written so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Flush buffered output.
    pub fn flush(&mut self) -> Result<(), IoError> {
        self.out
            .flush()
            .map_err(|e| IoError::file("flush(pcap)", &e))
    }

    /// Flush and return the inner writer.
    pub fn into_inner(mut self) -> Result<W, IoError> {
        self.flush()?;
        Ok(self.out)
    }
}

/// One record read back from a pcap file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcapRecord {
    /// Timestamp in ns since the Unix epoch (microsecond resolution).
    pub ts_ns: u64,
    /// Original length on the wire.
    pub orig_len: u32,
    /// Captured bytes.
    pub data: Vec<u8>,
}

/// Read a whole classic pcap stream (either byte order, µs or ns magic).
/// Returns the link type and the records.
pub fn read_pcap(mut r: impl Read) -> Result<(u32, Vec<PcapRecord>), IoError> {
    let mut all = Vec::new();
    r.read_to_end(&mut all)
        .map_err(|e| IoError::file("read(pcap)", &e))?;
    let hdr = all
        .get(..24)
        .ok_or(IoError::BadPcap("shorter than the global header"))?;
    let magic = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
    let (le, nanos) = match magic {
        0xa1b2_c3d4 => (true, false),
        0xa1b2_3c4d => (true, true),
        0xd4c3_b2a1 => (false, false),
        0x4d3c_b2a1 => (false, true),
        _ => return Err(IoError::BadPcap("unknown magic")),
    };
    let u32_at = |b: &[u8], o: usize| -> u32 {
        let a = [b[o], b[o + 1], b[o + 2], b[o + 3]];
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let linktype = u32_at(hdr, 20);
    let mut recs = Vec::new();
    let mut off = 24;
    while off < all.len() {
        let h = all
            .get(off..off + 16)
            .ok_or(IoError::BadPcap("truncated record header"))?;
        let (sec, frac, incl, orig) = (u32_at(h, 0), u32_at(h, 4), u32_at(h, 8), u32_at(h, 12));
        let start = off + 16;
        let data = all
            .get(start..start + incl as usize)
            .ok_or(IoError::BadPcap("truncated record data"))?
            .to_vec();
        let frac_ns = if nanos {
            u64::from(frac)
        } else {
            u64::from(frac) * 1000
        };
        recs.push(PcapRecord {
            ts_ns: u64::from(sec) * 1_000_000_000 + frac_ns,
            orig_len: orig,
            data,
        });
        off = start + incl as usize;
    }
    Ok((linktype, recs))
}

/// The two files a capture of `ifname` writes for `--capture base`:
/// `a/b/cap.pcap` + `eth0` -> (`a/b/cap.eth0.rx.pcap`, `a/b/cap.eth0.tx.pcap`).
pub fn capture_paths(base: &Path, ifname: &str) -> (PathBuf, PathBuf) {
    let stem = match base.extension() {
        Some(e) if e == "pcap" => base.with_extension(""),
        _ => base.to_path_buf(),
    };
    let mk = |dir: &str| {
        let mut s = stem.clone().into_os_string();
        s.push(format!(".{ifname}.{dir}.pcap"));
        PathBuf::from(s)
    };
    (mk("rx"), mk("tx"))
}

/// Wall-clock time in ns since the Unix epoch (for tx records and for rx
/// records whose backend gives no timestamp).
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A [`Port`] wrapper that writes every received and transmitted frame to
/// two pcap files. A write error stops the capture (counted, reported by
/// [`Captured::capture_error`]) but never the port.
pub struct Captured<P: Port> {
    inner: P,
    rx: PcapWriter<BufWriter<File>>,
    tx: PcapWriter<BufWriter<File>>,
    scratch: Vec<(u32, u32)>,
    scratch_bytes: Vec<u8>,
    error: Option<IoError>,
}

impl<P: Port> Captured<P> {
    /// Wrap `inner`, creating the two files given by [`capture_paths`].
    pub fn new(inner: P, base: &Path) -> Result<Self, IoError> {
        Self::with_files(inner, base, |p| {
            let f = File::create(p).map_err(|e| IoError::file("create(pcap)", &e))?;
            PcapWriter::new(BufWriter::new(f))
        })
    }

    fn with_files(
        inner: P,
        base: &Path,
        open: impl Fn(&Path) -> Result<PcapWriter<BufWriter<File>>, IoError>,
    ) -> Result<Self, IoError> {
        let (rxp, txp) = capture_paths(base, inner.name());
        Ok(Self {
            rx: open(&rxp)?,
            tx: open(&txp)?,
            inner,
            scratch: Vec::with_capacity(crate::BATCH_CAP),
            scratch_bytes: Vec::with_capacity(crate::BATCH_CAP * crate::FRAME_CAP),
            error: None,
        })
    }

    /// Wrap `inner`, appending to the two files of [`capture_paths`] (a
    /// port opened again after its interface came back): a file that
    /// exists and is not empty is continued, anything else starts with a
    /// pcap header.
    pub fn append(inner: P, base: &Path) -> Result<Self, IoError> {
        Self::with_files(inner, base, |p| {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| IoError::file("open(pcap)", &e))?;
            let used = f
                .metadata()
                .map_err(|e| IoError::file("stat(pcap)", &e))?
                .len();
            if used == 0 {
                PcapWriter::new(BufWriter::new(f))
            } else {
                Ok(PcapWriter::resume(BufWriter::new(f)))
            }
        })
    }

    /// The first write error, if the capture stopped.
    pub fn capture_error(&self) -> Option<IoError> {
        self.error
    }

    /// The wrapped port.
    pub fn inner_mut(&mut self) -> &mut P {
        &mut self.inner
    }

    fn note(&mut self, r: Result<(), IoError>) {
        if let Err(e) = r {
            self.error.get_or_insert(e);
        }
    }
}

impl<P: Port> Port for Captured<P> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }

    fn describe(&self) -> String {
        format!("{} (capturing)", self.inner.describe())
    }

    fn rx_batch(&mut self, batch: &mut Batch) -> usize {
        let first = batch.len();
        let n = self.inner.rx_batch(batch);
        if self.error.is_none() {
            for i in first..first + n {
                let ts = batch.meta(i).map_or(0, |m| m.timestamp_ns);
                let ts = if ts == 0 { now_ns() } else { ts };
                if let Some(d) = batch.data(i) {
                    let r = self.rx.write_frame(d, ts);
                    self.note(r);
                }
            }
        }
        n
    }

    fn tx_batch(&mut self, batch: &mut Batch, which: &[u16]) -> usize {
        // Copy first: a zero-copy transmit hands the bytes over.
        self.scratch.clear();
        self.scratch_bytes.clear();
        for &i in which {
            if let Some(d) = batch.data(usize::from(i)) {
                self.scratch
                    .push((self.scratch_bytes.len() as u32, d.len() as u32));
                self.scratch_bytes.extend_from_slice(d);
            }
        }
        let n = self.inner.tx_batch(batch, which);
        if self.error.is_none() {
            let ts = now_ns();
            for k in 0..n.min(self.scratch.len()) {
                let (o, l) = self.scratch[k];
                let r = self
                    .tx
                    .write_frame(&self.scratch_bytes[o as usize..(o + l) as usize], ts);
                self.note(r);
            }
        }
        n
    }

    fn flush(&mut self) -> Result<(), IoError> {
        let r = self.rx.flush().and_then(|()| self.tx.flush());
        self.note(r);
        self.inner.flush()
    }

    fn poll_fd(&self) -> Option<RawFd> {
        self.inner.poll_fd()
    }

    fn stats(&mut self) -> PortStats {
        self.inner.stats()
    }
}

impl<P: Port> Drop for Captured<P> {
    fn drop(&mut self) {
        let _ = self.rx.flush();
        let _ = self.tx.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::FrameMeta;
    use crate::memport::MemPort;

    #[test]
    fn writer_emits_classic_pcap_bytes() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_frame(&[0xde, 0xad, 0xbe, 0xef], 1_700_000_000_123_456_789)
            .unwrap();
        let out = w.into_inner().unwrap();
        assert_eq!(out.len(), 24 + 16 + 4);
        assert_eq!(&out[0..4], &MAGIC_US.to_ne_bytes());
        assert_eq!(&out[20..24], &1u32.to_ne_bytes());
        assert_eq!(&out[24..28], &1_700_000_000u32.to_ne_bytes());
        assert_eq!(&out[28..32], &123_456u32.to_ne_bytes());
        assert_eq!(&out[32..36], &4u32.to_ne_bytes());
        assert_eq!(&out[36..40], &4u32.to_ne_bytes());
        assert_eq!(&out[40..], &[0xde, 0xad, 0xbe, 0xef]);
    }

    #[test]
    fn round_trip_through_reader() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        for i in 0..5u8 {
            w.write_frame(
                &vec![i; 60 + usize::from(i)],
                u64::from(i) * 1_000_000_000 + 5000,
            )
            .unwrap();
        }
        let (lt, recs) = read_pcap(&w.into_inner().unwrap()[..]).unwrap();
        assert_eq!(lt, LINKTYPE_ETHERNET);
        assert_eq!(recs.len(), 5);
        assert_eq!(recs[3].data, vec![3u8; 63]);
        assert_eq!(recs[3].ts_ns, 3_000_005_000);
    }

    #[test]
    fn reader_rejects_garbage() {
        assert_eq!(
            read_pcap(&[0u8; 10][..]),
            Err(IoError::BadPcap("shorter than the global header"))
        );
        assert_eq!(
            read_pcap(&[0u8; 24][..]),
            Err(IoError::BadPcap("unknown magic"))
        );
    }

    #[test]
    fn capture_paths_split_by_direction() {
        let (rx, tx) = capture_paths(Path::new("/tmp/x/cap.pcap"), "eth0");
        assert_eq!(rx, PathBuf::from("/tmp/x/cap.eth0.rx.pcap"));
        assert_eq!(tx, PathBuf::from("/tmp/x/cap.eth0.tx.pcap"));
        let (rx, _) = capture_paths(Path::new("cap"), "v1");
        assert_eq!(rx, PathBuf::from("cap.v1.rx.pcap"));
    }

    #[test]
    fn captured_port_writes_rx_and_tx_files() {
        let dir = std::env::temp_dir().join(format!("sluice-io-pcap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let base = dir.join("cap.pcap");
        let (p, peer) = MemPort::new("m0", 0);
        let mut c = Captured::new(p, &base).unwrap();
        peer.inject(&[1u8; 60], 2_000_000_000);
        peer.inject(&[2u8; 61], 3_000_000_000);
        let mut b = Batch::new();
        assert_eq!(c.rx_batch(&mut b), 2);
        b.data_mut(1).unwrap()[0] = 9;
        assert_eq!(c.tx_batch(&mut b, &[1]), 1);
        c.flush().unwrap();
        drop(c);
        let (rxp, txp) = capture_paths(&base, "m0");
        let (_, rx) = read_pcap(File::open(&rxp).unwrap()).unwrap();
        let (_, tx) = read_pcap(File::open(&txp).unwrap()).unwrap();
        assert_eq!(rx.len(), 2);
        assert_eq!(rx[0].ts_ns, 2_000_000_000);
        assert_eq!(
            rx[1].data[0], 2,
            "rx is recorded before the engine rewrites"
        );
        assert_eq!(tx.len(), 1);
        assert_eq!(tx[0].data[0], 9);
        assert_eq!(peer.collect_all().len(), 1);
        let _ = FrameMeta::default();
        // A port opened again continues the files, one header each.
        let (p, peer) = MemPort::new("m0", 0);
        let mut c = Captured::append(p, &base).unwrap();
        peer.inject(&[3u8; 62], 4_000_000_000);
        assert_eq!(c.rx_batch(&mut b), 1);
        drop(c);
        let (_, rx) = read_pcap(File::open(&rxp).unwrap()).unwrap();
        assert_eq!(rx.len(), 3);
        assert_eq!((rx[2].ts_ns, rx[2].data[0]), (4_000_000_000, 3));
        // Appending to files that do not exist yet starts them.
        let fresh = dir.join("new.pcap");
        let (p, _peer) = MemPort::new("m1", 0);
        drop(Captured::append(p, &fresh).unwrap());
        let (rxp, _) = capture_paths(&fresh, "m1");
        assert_eq!(read_pcap(File::open(&rxp).unwrap()).unwrap().1.len(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
