//! [`AgentConnection`] on an asynchronous (tokio) stream.

use super::*;

impl<S: tokio::io::AsyncWrite + Unpin> AgentConnection<S> {
    /// [`AgentConnection::send_request`] on an asynchronous stream.
    pub async fn send_request_async(&mut self, op: Operation) -> Result<RequestId, ClientError> {
        let (id, frame) = self.request_frame(op)?;
        write_async(&mut self.stream, &frame).await?;
        Ok(id)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> AgentConnection<S> {
    /// [`AgentConnection::send_input`] on an asynchronous stream (a file write's data,
    /// chunk by chunk, as it arrives from elsewhere).
    pub async fn send_input_async(
        &mut self,
        id: RequestId,
        input: Input,
    ) -> Result<(), ClientError> {
        let frame = input_frame(id, input)?;
        write_async(&mut self.stream, &frame).await
    }
}

impl<S: tokio::io::AsyncRead + Unpin> AgentConnection<S> {
    /// [`AgentConnection::next_answer`] on an asynchronous stream.
    pub async fn next_answer_async(&mut self, id: RequestId) -> Result<AgentBody, ClientError> {
        let frame = frame::read_frame_async(&mut self.stream).await?;
        self.answer(id, &frame)
    }
}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> AgentConnection<S> {
    /// Runs `call` to its final answer on an asynchronous stream. Dropping the future
    /// part-way leaves the connection in an unknown state: drop the connection too.
    pub async fn run_async<T>(&mut self, mut call: Call<T>) -> Result<T, ClientError> {
        let (id, frames) = self.start(&mut call)?;
        write_async(&mut self.stream, &frames).await?;
        loop {
            let body = self.next_answer_async(id).await?;
            if let Some(out) = call.feed(id, body)? {
                return Ok(out);
            }
        }
    }
}

/// Writes whole frames to an asynchronous stream.
pub async fn write_async(
    w: &mut (impl tokio::io::AsyncWrite + Unpin),
    frames: &[u8],
) -> Result<(), ClientError> {
    use tokio::io::AsyncWriteExt;
    w.write_all(frames).await.map_err(FrameError::Io)?;
    w.flush().await.map_err(FrameError::Io)?;
    Ok(())
}
