//! The registration socket's one concession to the kubelet: `:authority` becomes `localhost`.
//!
//! The kubelet's plugin manager (v1.37) dials `<registry>/<driver>-reg.sock` with the bare
//! socket path as gRPC target and no authority override, so grpc-go sends the percent-encoded
//! path (`%2Fvar%2Flib%2Fkubelet%2F...-reg.sock`) as `:authority`. The `http` crate under
//! tonic's h2 refuses a `%` in a host and h2 resets every such stream with `PROTOCOL_ERROR`, so
//! the kubelet could never call `GetInfo`. (Its device-plugin and DRA-service dials name
//! `localhost` and are not affected.)
//!
//! [`relay`] stands between an accepted connection and the tonic server: it copies the
//! server's bytes back unchanged, and the client's frames forward unchanged except a HEADERS
//! frame's `:authority` field, whose value is rewritten to `localhost` in the HPACK block. Only
//! the literal carrying the value is touched (indexed fields, names and other values are
//! copied byte for byte), so the server's HPACK decoder reads a valid block and later
//! references to that dynamic-table entry resolve to `localhost`. The client's and the server's
//! tables then differ in the size of that one entry, which only matters once the 4 KiB table
//! evicts: far beyond the two small calls a registration makes. A header block split over
//! CONTINUATION frames, or one that does not parse, is forwarded untouched (and h2 judges it).

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::UnixStream;

/// The HTTP/2 connection preface a client sends first.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADERS: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// `:authority` in HPACK's static table.
const AUTHORITY_INDEX: usize = 1;
const LOCALHOST: &[u8] = b"localhost";
/// Larger frames are not ours to parse (16 MiB is HTTP/2's own ceiling).
const MAX_FRAME: usize = 1 << 24;

/// Relays `client` to the returned stream (hand it to the server), rewriting `:authority` on
/// the way in. The relay ends when either side closes.
pub fn relay(client: UnixStream) -> DuplexStream {
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let (mut client_read, mut client_write) = client.into_split();
        let (mut server_read, mut server_write) = tokio::io::split(theirs);
        let inbound = async {
            if let Err(e) = forward(&mut client_read, &mut server_write).await {
                tracing::debug!(error = %e, "registration connection: client side closed");
            }
            let _ = server_write.shutdown().await;
        };
        let outbound = async {
            let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
            let _ = client_write.shutdown().await;
        };
        tokio::join!(inbound, outbound);
    });
    ours
}

/// Copies the client's preface and frames to `to`, rewriting HEADERS frames.
async fn forward<R, W>(from: &mut R, to: &mut W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    to.write_all(&preface).await?;
    if &preface != PREFACE {
        // Not HTTP/2 with prior knowledge: pass the rest through for the server to refuse.
        tokio::io::copy(from, to).await?;
        return Ok(());
    }
    loop {
        let mut header = [0u8; 9];
        from.read_exact(&mut header).await?;
        let length =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        if length > MAX_FRAME {
            to.write_all(&header).await?;
            tokio::io::copy(from, to).await?;
            return Ok(());
        }
        let mut payload = vec![0u8; length];
        from.read_exact(&mut payload).await?;
        let (kind, flags) = (header[3], header[4]);
        if kind == FRAME_HEADERS
            && flags & FLAG_END_HEADERS != 0
            && let Some(rewritten) = rewrite_headers_payload(flags, &payload)
            && let Some(new_length) = frame_length(rewritten.len())
        {
            header[..3].copy_from_slice(&new_length);
            payload = rewritten;
        }
        to.write_all(&header).await?;
        to.write_all(&payload).await?;
    }
}

/// A frame length as the 3 bytes of a frame header.
fn frame_length(n: usize) -> Option<[u8; 3]> {
    let n = u32::try_from(n).ok().filter(|n| *n < 1 << 24)?;
    let [_, a, b, c] = n.to_be_bytes();
    Some([a, b, c])
}

/// A HEADERS payload with its block's `:authority` rewritten; `None` to leave it as it is.
fn rewrite_headers_payload(flags: u8, payload: &[u8]) -> Option<Vec<u8>> {
    let mut start = 0;
    let mut pad = 0;
    if flags & FLAG_PADDED != 0 {
        pad = usize::from(*payload.first()?);
        start = 1;
    }
    if flags & FLAG_PRIORITY != 0 {
        start += 5;
    }
    let end = payload.len().checked_sub(pad)?;
    let block = payload.get(start..end)?;
    let new_block = rewrite_block(block)?;
    let mut out = Vec::with_capacity(payload.len() + LOCALHOST.len());
    out.extend_from_slice(payload.get(..start)?);
    out.extend_from_slice(&new_block);
    out.extend_from_slice(payload.get(end..)?);
    Some(out)
}

/// An HPACK header block with every literal `:authority` value replaced by `localhost`;
/// `None` when nothing needed replacing or the block does not parse.
fn rewrite_block(block: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(block.len());
    let mut changed = false;
    let mut i = 0;
    while i < block.len() {
        let first = block[i];
        let prefix = if first & 0x80 != 0 {
            // Indexed field: copied as it is.
            let (_, n) = integer(&block[i..], 7)?;
            out.extend_from_slice(&block[i..i + n]);
            i += n;
            continue;
        } else if first & 0xc0 == 0x40 {
            6 // literal with incremental indexing
        } else if first & 0xe0 == 0x20 {
            // Dynamic table size update.
            let (_, n) = integer(&block[i..], 5)?;
            out.extend_from_slice(&block[i..i + n]);
            i += n;
            continue;
        } else {
            4 // literal without indexing, or never indexed
        };
        let (name_index, n) = integer(&block[i..], prefix)?;
        let mut end = i + n;
        if name_index == 0 {
            end += string_length(block.get(end..)?)?;
        }
        let value_start = end;
        let value_end = value_start + string_length(block.get(value_start..)?)?;
        out.extend_from_slice(block.get(i..value_start)?);
        if name_index == AUTHORITY_INDEX {
            // A plain (not Huffman-coded) string of 9 bytes: length fits the 7-bit prefix.
            out.push(u8::try_from(LOCALHOST.len()).ok()?);
            out.extend_from_slice(LOCALHOST);
            changed = true;
        } else {
            out.extend_from_slice(block.get(value_start..value_end)?);
        }
        i = value_end;
    }
    changed.then_some(out)
}

/// An HPACK integer with an `prefix`-bit prefix at the start of `b`: its value and length.
fn integer(b: &[u8], prefix: u32) -> Option<(usize, usize)> {
    let max = (1usize << prefix) - 1;
    let mut value = usize::from(*b.first()?) & max;
    if value < max {
        return Some((value, 1));
    }
    let mut shift = 0u32;
    for (k, byte) in b.iter().enumerate().skip(1) {
        value = value.checked_add(usize::from(byte & 0x7f).checked_shl(shift)?)?;
        if byte & 0x80 == 0 {
            return Some((value, k + 1));
        }
        shift += 7;
        if shift > 28 {
            return None;
        }
    }
    None
}

/// The encoded length (prefix and bytes) of the HPACK string at the start of `b`.
fn string_length(b: &[u8]) -> Option<usize> {
    let (len, n) = integer(b, 7)?;
    let total = n.checked_add(len)?;
    (total <= b.len()).then_some(total)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    /// A plain HPACK string.
    fn string(s: &str) -> Vec<u8> {
        let mut out = vec![u8::try_from(s.len()).unwrap()];
        out.extend_from_slice(s.as_bytes());
        out
    }

    /// What grpc-go sends for a registration call: `:method POST` and `:scheme http` indexed,
    /// `:path` and `:authority` as literals with incremental indexing on indexed names, then a
    /// literal with a literal name.
    fn kubelet_block(authority: &str) -> Vec<u8> {
        let mut b = vec![0x83, 0x86];
        b.push(0x44); // :path (static 4)
        b.extend(string("/pluginregistration.Registration/GetInfo"));
        b.push(0x41); // :authority (static 1)
        b.extend(string(authority));
        b.push(0x40); // literal name
        b.extend(string("te"));
        b.extend(string("trailers"));
        b
    }

    #[test]
    fn the_authority_value_becomes_localhost_and_nothing_else_changes() {
        let path = "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.fumarole.dev-reg.sock";
        let out = rewrite_block(&kubelet_block(path)).unwrap();
        assert_eq!(out, kubelet_block("localhost"));
        // Already fine, or no authority at all: left alone.
        assert_eq!(
            rewrite_block(&kubelet_block("localhost")),
            Some(kubelet_block("localhost"))
        );
        assert_eq!(rewrite_block(&[0x83, 0x86, 0xbe]), None);
    }

    #[test]
    fn long_values_and_indexes_use_multi_byte_integers() {
        let long = "x".repeat(300);
        let mut block = vec![0x41, 0x7f];
        // 300 - 127 = 173 = 0xad: 0x80 | (173 & 0x7f), then 173 >> 7.
        block.extend([0x80 | (173 & 0x7f), 173 >> 7]);
        block.extend(long.as_bytes());
        // A dynamic-table reference with a two-byte index (index 200).
        block.extend([0xff, 200 - 127]);
        let out = rewrite_block(&block).unwrap();
        let mut want = vec![0x41];
        want.extend(string("localhost"));
        want.extend([0xff, 200 - 127]);
        assert_eq!(out, want);
        assert_eq!(integer(&[0x1f, 0x9a, 0x0a], 5), Some((1337, 3)));
    }

    #[test]
    fn malformed_blocks_are_left_alone() {
        let mut cut = kubelet_block("%2Ftmp%2Fx");
        cut.truncate(cut.len() - 3);
        assert_eq!(rewrite_block(&cut), None);
        assert_eq!(rewrite_block(&[0x41, 0x0a, b'a']), None);
        assert_eq!(integer(&[0x7f, 0xff, 0xff, 0xff, 0xff, 0xff], 7), None);
    }

    #[test]
    fn padding_and_priority_are_kept_around_the_block() {
        let block = kubelet_block("%2Ftmp%2Fx");
        let mut payload = vec![2]; // pad length
        payload.extend([0, 0, 0, 3, 16]); // priority: stream dependency, weight
        payload.extend(&block);
        payload.extend([0, 0]);
        let out = rewrite_headers_payload(FLAG_PADDED | FLAG_PRIORITY, &payload).unwrap();
        let mut want = vec![2, 0, 0, 0, 3, 16];
        want.extend(kubelet_block("localhost"));
        want.extend([0, 0]);
        assert_eq!(out, want);
        assert_eq!(rewrite_headers_payload(FLAG_PADDED, &[9, 1]), None);
    }

    #[tokio::test]
    async fn frames_pass_through_with_only_the_headers_rewritten() {
        let block = kubelet_block("%2Ftmp%2Fx.sock");
        let frame = |kind: u8, flags: u8, payload: &[u8]| {
            let mut f = frame_length(payload.len()).unwrap().to_vec();
            f.extend([kind, flags, 0, 0, 0, 1]);
            f.extend(payload);
            f
        };
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, &[])); // SETTINGS
        input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, &block));
        input.extend(frame(0x0, 0x1, &[0, 0, 0, 0, 0])); // DATA, END_STREAM
        let mut want = PREFACE.to_vec();
        want.extend(frame(0x4, 0, &[]));
        want.extend(frame(
            FRAME_HEADERS,
            FLAG_END_HEADERS,
            &kubelet_block("localhost"),
        ));
        want.extend(frame(0x0, 0x1, &[0, 0, 0, 0, 0]));
        let mut out = Vec::new();
        let err = forward(&mut input.as_slice(), &mut out).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
        assert_eq!(out, want);
    }
}
