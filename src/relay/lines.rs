//! Newline-delimited JSON-RPC, as MCP's stdio transport frames it: one message per line,
//! bounded.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

use super::WireQueue;

/// How much of a line over the bound is kept, to find its JSON-RPC id.
const PREFIX_KEPT: usize = 4096;

/// One line read by [`read_line`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// A whole line, without its line ending (`\n` or `\r\n`).
    Message(Bytes),
    /// A line longer than the bound: its first bytes (up to 4 KiB); the rest was read and
    /// dropped, never held in memory.
    TooLong(Bytes),
}

/// The next non-empty line of `reader`, holding at most `max` bytes of it; `None` at the end
/// of the stream (a last line without its `\n` is still a line).
pub async fn read_line<R>(reader: &mut R, max: usize) -> std::io::Result<Option<Line>>
where
    R: AsyncBufRead + Unpin,
{
    loop {
        let mut line = BytesMut::new();
        let mut too_long = false;
        let mut ended = false;
        loop {
            let buffer = reader.fill_buf().await?;
            if buffer.is_empty() {
                ended = true;
                break;
            }
            let (chunk, newline) = match buffer.iter().position(|&b| b == b'\n') {
                Some(at) => (&buffer[..at], true),
                None => (buffer, false),
            };
            let taken = chunk.len() + usize::from(newline);
            if !too_long && line.len() + chunk.len() <= max {
                line.extend_from_slice(chunk);
            } else {
                if !too_long {
                    too_long = true;
                    line.truncate(PREFIX_KEPT);
                }
                let room = PREFIX_KEPT.saturating_sub(line.len());
                line.extend_from_slice(&chunk[..room.min(chunk.len())]);
            }
            reader.consume(taken);
            if newline {
                break;
            }
        }
        if too_long {
            return Ok(Some(Line::TooLong(line.freeze())));
        }
        if line.last() == Some(&b'\r') {
            line.truncate(line.len() - 1);
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            if ended {
                return Ok(None);
            }
            continue;
        }
        return Ok(Some(Line::Message(line.freeze())));
    }
}

/// Writes `message` and its `\n`, and flushes.
pub async fn write_line<W>(writer: &mut W, message: &[u8]) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    writer.write_all(message).await?;
    writer.write_all(b"\n").await?;
    writer.flush().await
}

/// Writes every message of `queue` to `writer`, one line each, telling each sender how its
/// write went: not written when the writer failed before it took the message's first byte
/// (a broken pipe takes nothing: the peer cannot have read any of it), failed after. Returns
/// at the first write error (the peer is gone) or when the queue ends.
pub async fn write_queue<W>(queue: &mut WireQueue, writer: &mut W) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    while let Some(outgoing) = queue.next().await {
        let mut taken = 0;
        let result = write_counted(writer, outgoing.message(), &mut taken).await;
        match result {
            Ok(()) => outgoing.written(),
            Err(error) => {
                let copy = std::io::Error::new(error.kind(), error.to_string());
                if taken == 0 {
                    outgoing.not_written(format!("the peer's input is closed ({error})"));
                } else {
                    // A line taken in part: the peer cannot act on a line without its end,
                    // but that is not proof it read none of it.
                    outgoing.failed(error);
                }
                return Err(copy);
            }
        }
    }
    Ok(())
}

/// [`write_line`], counting in `taken` the bytes the writer took before any error.
async fn write_counted<W>(writer: &mut W, message: &[u8], taken: &mut usize) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    for part in [message, b"\n"] {
        let mut rest = part;
        while !rest.is_empty() {
            let n = writer.write(rest).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            *taken += n;
            rest = &rest[n..];
        }
    }
    writer.flush().await
}

#[cfg(test)]
mod tests {
    use tokio::io::BufReader;

    use super::*;

    async fn lines(input: &[u8], max: usize, buffer: usize) -> Vec<Line> {
        let mut reader = BufReader::with_capacity(buffer, input);
        let mut out = Vec::new();
        while let Some(line) = read_line(&mut reader, max).await.unwrap() {
            out.push(line);
        }
        out
    }

    #[tokio::test]
    async fn lines_are_split_trimmed_and_bounded_at_every_buffer_size() {
        let long = format!("{{\"id\":3,\"x\":\"{}\"}}", "y".repeat(10_000));
        let input = format!("a\r\n\n  \nbb\n{long}\nccc");
        for buffer in [1, 2, 3, 7, 64, 8192] {
            let got = lines(input.as_bytes(), 100, buffer).await;
            assert_eq!(got.len(), 4, "buffer {buffer}: {got:?}");
            assert_eq!(got[0], Line::Message(Bytes::from_static(b"a")));
            assert_eq!(got[1], Line::Message(Bytes::from_static(b"bb")));
            let Line::TooLong(prefix) = &got[2] else {
                panic!("buffer {buffer}: {:?}", got[2]);
            };
            assert_eq!(prefix.len(), PREFIX_KEPT);
            assert!(long.as_bytes().starts_with(prefix));
            assert_eq!(got[3], Line::Message(Bytes::from_static(b"ccc")));
        }
    }

    #[tokio::test]
    async fn a_line_of_exactly_the_bound_is_a_message() {
        let got = lines(b"12345\n123456\n", 5, 2).await;
        assert_eq!(got[0], Line::Message(Bytes::from_static(b"12345")));
        assert!(matches!(got[1], Line::TooLong(_)));
    }

    /// Found by attacking it: a write to a server that had already gone (a broken
    /// pipe, not one byte taken) was `failed`, so a call that provably never left was
    /// `unknown` and an irreversible one was held for review.
    #[tokio::test]
    async fn a_message_the_closed_pipe_took_nothing_of_is_not_written() {
        let (wire, mut queue) = super::super::Wire::new();
        let (mut ours, theirs) = tokio::io::duplex(64);
        drop(theirs);
        let sending = tokio::spawn(async move { wire.notify(Bytes::from_static(b"{}")).await });
        assert!(write_queue(&mut queue, &mut ours).await.is_err());
        let error = sending.await.unwrap().unwrap_err();
        assert!(
            crate::protocol::transport::nothing_was_sent(&*error),
            "not written: {error}"
        );
    }
}
