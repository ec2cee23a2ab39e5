//! Reading what a BMC (or a tool talking to one) sends, with a hard cap: one BMC streaming
//! gigabytes must not take down the process that powers every host.

use std::io;
use std::process::ExitStatus;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest Redfish response body read by default: 1 MiB. Real payloads (a System, an
/// ActionInfo, an error) are a few KiB; vendors' biggest collections stay well under this.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;

/// Largest output kept from a child process (ipmitool, a reboot command), per stream. What
/// comes after is read and dropped, so the child never blocks on a full pipe.
pub const MAX_CHILD_OUTPUT_BYTES: usize = 64 * 1024;

/// A response body that was not read whole.
#[derive(Debug)]
pub enum BodyError {
    /// Longer than the cap: refused up front (`Content-Length`) or cut while streaming.
    TooLarge(TooLarge),
    /// The connection failed while reading.
    Transport(reqwest::Error),
}

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the answer is larger than the {limit_text} hostcycle reads from a BMC ({how}); no Redfish \
     resource is that big, so the BMC is misbehaving or the address points at another service: \
     check the BMC's firmware and the address",
    limit_text = human_bytes(*.limit as u64),
    how = match .declared {
        Some(length) => format!("it announced {length} bytes and was not read"),
        None => format!("it kept sending after {}; the rest was not read", human_bytes(*.limit as u64)),
    }
)]
pub struct TooLarge {
    /// The cap, in bytes.
    pub limit: usize,
    /// The `Content-Length` the server announced, when that is what gave it away.
    pub declared: Option<u64>,
}

/// `1 MiB`, `512 KiB` or `100 bytes`.
pub fn human_bytes(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * 1024;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes.is_multiple_of(KIB) {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// The whole body of `response` if it is at most `limit` bytes. A larger `Content-Length`
/// is refused before reading; a body without one (chunked) is read until it passes the
/// limit, then the connection is dropped.
pub async fn read_body(mut response: reqwest::Response, limit: usize) -> Result<Bytes, BodyError> {
    if let Some(declared) = response.content_length()
        && declared > limit as u64
    {
        return Err(BodyError::TooLarge(TooLarge {
            limit,
            declared: Some(declared),
        }));
    }
    let capacity = response
        .content_length()
        .and_then(|length| usize::try_from(length).ok())
        .unwrap_or(0)
        .min(limit);
    let mut body = BytesMut::with_capacity(capacity);
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Transport)? {
        if chunk.len() > limit.saturating_sub(body.len()) {
            return Err(BodyError::TooLarge(TooLarge {
                limit,
                declared: None,
            }));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// What a child printed (each stream cut at its limit) and how it ended.
#[derive(Debug)]
pub struct CappedOutput {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Like [`tokio::process::Child::wait_with_output`], keeping at most `limit` bytes of each
/// stream.
pub async fn wait_with_capped_output(
    mut child: tokio::process::Child,
    limit: usize,
) -> io::Result<CappedOutput> {
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let (stdout, stderr) =
        tokio::try_join!(read_capped(stdout, limit), read_capped(stderr, limit))?;
    let status = child.wait().await?;
    Ok(CappedOutput {
        status,
        stdout,
        stderr,
    })
}

/// Reads `pipe` to its end, keeping the first `limit` bytes.
async fn read_capped(pipe: Option<impl AsyncRead + Unpin>, limit: usize) -> io::Result<Vec<u8>> {
    let Some(mut pipe) = pipe else {
        return Ok(Vec::new());
    };
    let mut kept = Vec::new();
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let read = pipe.read(&mut buffer).await?;
        if read == 0 {
            return Ok(kept);
        }
        let room = limit.saturating_sub(kept.len());
        kept.extend_from_slice(&buffer[..read.min(room)]);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sizes_read_well() {
        assert_eq!(human_bytes(1024 * 1024), "1 MiB");
        assert_eq!(human_bytes(64 * 1024), "64 KiB");
        assert_eq!(human_bytes(1000), "1000 bytes");
        let refused = TooLarge {
            limit: DEFAULT_MAX_BODY_BYTES,
            declared: Some(3_000_000_000),
        };
        let text = refused.to_string();
        assert!(text.contains("larger than the 1 MiB"), "{text}");
        assert!(text.contains("announced 3000000000 bytes"), "{text}");
    }

    #[tokio::test]
    async fn child_output_is_capped_and_the_child_still_finishes() {
        let child = tokio::process::Command::new("sh")
            .args(["-c", "head -c 10000000 /dev/zero; echo done >&2"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let output = wait_with_capped_output(child, 1000).await.unwrap();
        assert!(output.status.success());
        assert_eq!(output.stdout.len(), 1000);
        assert_eq!(output.stderr, b"done\n");
    }
}
