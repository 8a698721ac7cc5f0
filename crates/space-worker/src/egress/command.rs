//! Running `nft` (and, in tests, `ip`) with fixed argument vectors (never a shell), with
//! a bounded read of what they say on stderr.

use std::io::{self, Read, Write};
use std::process::{Command, ExitStatus, Stdio};

/// Most bytes of a command's stderr kept for its error.
pub const MAX_STDERR: u64 = 4096;

/// A command that could not be run or did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("cannot run `{command}`: {source}")]
    Spawn { command: String, source: io::Error },
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: ExitStatus,
        stderr: String,
    },
}

impl CommandError {
    /// What the command printed on stderr (cut at [`MAX_STDERR`]), when it ran.
    pub fn stderr(&self) -> Option<&str> {
        match self {
            CommandError::Failed { stderr, .. } => Some(stderr),
            CommandError::Spawn { .. } => None,
        }
    }
}

/// Runs `program args…`, feeding `stdin` when given; `Ok` on exit status 0.
/// Blocking: call it off the async runtime.
pub fn run(program: &str, args: &[&str], stdin: Option<&[u8]>) -> Result<(), CommandError> {
    let command = std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let spawn_error = |source| CommandError::Spawn {
        command: command.clone(),
        source,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_error)?;
    let input = child.stdin.take();
    let mut stderr_pipe = child.stderr.take();
    let mut stderr = Vec::new();
    std::thread::scope(|scope| {
        // The input is written from a thread of its own so a command that reports an
        // error before reading everything cannot block us on a full pipe.
        if let (Some(mut pipe), Some(bytes)) = (input, stdin) {
            scope.spawn(move || {
                // A command that exits early closes its end: its status says why.
                let _ = pipe.write_all(bytes);
            });
        }
        if let Some(pipe) = stderr_pipe.take() {
            // Past the bound the pipe is closed: the command sees EPIPE, not a hang.
            let _ = pipe.take(MAX_STDERR).read_to_end(&mut stderr);
        }
    });
    let status = child.wait().map_err(spawn_error)?;
    if status.success() {
        return Ok(());
    }
    Err(CommandError::Failed {
        command,
        status,
        stderr: String::from_utf8_lossy(&stderr).trim().to_owned(),
    })
}

/// Whether `program` can be found on `PATH` (for the tests' skip messages and for the
/// worker's start-up check).
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path)
            .any(|dir| std::fs::metadata(dir.join(program)).is_ok_and(|m| m.is_file()))
    })
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn a_failing_command_is_named_with_its_stderr() {
        let err = run("sh", &["-c", "echo nope >&2; exit 3"], None).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("`sh -c echo nope >&2; exit 3` failed"),
            "{text}"
        );
        assert_eq!(err.stderr(), Some("nope"));
    }

    #[test]
    fn stdin_reaches_the_command_and_stderr_is_cut_at_the_bound() {
        run(
            "sh",
            &["-c", "read line; test \"$line\" = hello"],
            Some(b"hello\n"),
        )
        .unwrap();
        let err = run(
            "sh",
            &["-c", "head -c 100000 /dev/zero | tr '\\0' x >&2; exit 1"],
            None,
        )
        .unwrap_err();
        assert_eq!(err.stderr().map(str::len), Some(MAX_STDERR as usize));
    }

    #[test]
    fn a_missing_program_is_a_spawn_error() {
        let err = run("space-no-such-program", &[], None).unwrap_err();
        assert!(matches!(err, CommandError::Spawn { .. }), "{err}");
        assert!(!on_path("space-no-such-program"));
        assert!(on_path("sh"));
    }
}
