//! Command line: parsed into a typed configuration, or a clear error before anything
//! is opened or bound.

use std::os::fd::RawFd;
use std::path::PathBuf;

/// Usage text, printed with every command-line error.
pub const USAGE: &str = "usage:
  spaced-guest serve (--listen-fd N | --listen PATH) (--activation-fd M | --activation-file PATH)
                     [--home DIR] [--max-connections N]

  --listen-fd N          accept connections on inherited listening socket N
  --listen PATH          bind a Unix socket at PATH (tests, debugging)
  --activation-fd M      read the activation record (JSON) from descriptor M until EOF
  --activation-file PATH read the activation record from PATH
  --home DIR             default working directory and base of relative paths
                         (default: /root for uid 0, else $HOME, else /)
  --max-connections N    connections served at once before answering `busy` (default 256)";

/// Where connections come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenSource {
    /// A listening socket inherited from the launcher.
    Fd(RawFd),
    /// A Unix socket path to bind.
    Path(PathBuf),
}

/// Where the activation record comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ActivationSource {
    /// A descriptor inherited from the launcher, read until EOF.
    Fd(RawFd),
    /// A file.
    File(PathBuf),
}

/// The agent's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Where connections come from.
    pub listen: ListenSource,
    /// Where the activation record comes from.
    pub activation: ActivationSource,
    /// Default working directory and base of relative paths.
    pub home: PathBuf,
    /// Connections served at once.
    pub max_connections: usize,
}

/// A command-line error.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

/// The default home: `/root` for root, else `$HOME` (given as `env_home`), else `/`.
pub fn default_home(uid: u32, env_home: Option<&str>) -> PathBuf {
    match (uid, env_home) {
        (0, _) => PathBuf::from("/root"),
        (_, Some(h)) if h.starts_with('/') => PathBuf::from(h),
        _ => PathBuf::from("/"),
    }
}

impl Config {
    /// Parses the arguments after the program name. `default_home` is used when
    /// `--home` is absent (pass [`default_home`]'s answer; a parameter so tests need
    /// no environment).
    pub fn parse<I, S>(args: I, default_home: PathBuf) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut args = args.into_iter().map(Into::into);
        match args.next().as_deref() {
            Some("serve") => {}
            Some(other) => return err(format!("unknown command {other:?}")),
            None => return err("missing command"),
        }
        let (mut listen, mut activation, mut home, mut max_connections) = (None, None, None, None);
        while let Some(flag) = args.next() {
            let Some(value) = args.next() else {
                return err(format!("{flag} needs a value"));
            };
            let slot_taken = |taken: bool| {
                if taken {
                    err(format!("{flag} given twice, or with its alternative"))
                } else {
                    Ok(())
                }
            };
            match flag.as_str() {
                "--listen-fd" => {
                    slot_taken(listen.is_some())?;
                    listen = Some(ListenSource::Fd(parse_fd(&flag, &value)?));
                }
                "--listen" => {
                    slot_taken(listen.is_some())?;
                    listen = Some(ListenSource::Path(non_empty_path(&flag, value)?));
                }
                "--activation-fd" => {
                    slot_taken(activation.is_some())?;
                    activation = Some(ActivationSource::Fd(parse_fd(&flag, &value)?));
                }
                "--activation-file" => {
                    slot_taken(activation.is_some())?;
                    activation = Some(ActivationSource::File(non_empty_path(&flag, value)?));
                }
                "--home" => {
                    slot_taken(home.is_some())?;
                    if !value.starts_with('/') {
                        return err("--home must be an absolute path");
                    }
                    home = Some(PathBuf::from(value));
                }
                "--max-connections" => {
                    slot_taken(max_connections.is_some())?;
                    match value.parse::<usize>() {
                        Ok(n) if n > 0 => max_connections = Some(n),
                        _ => return err("--max-connections must be a positive integer"),
                    }
                }
                _ => return err(format!("unknown flag {flag}")),
            }
        }
        let (Some(listen), Some(activation)) = (listen, activation) else {
            return err(
                "need one of --listen-fd/--listen and one of --activation-fd/--activation-file",
            );
        };
        if let (ListenSource::Fd(a), ActivationSource::Fd(b)) = (&listen, &activation) {
            if a == b {
                return err("--listen-fd and --activation-fd name the same descriptor");
            }
        }
        Ok(Self {
            listen,
            activation,
            home: home.unwrap_or(default_home),
            max_connections: max_connections.unwrap_or(256),
        })
    }
}

fn parse_fd(flag: &str, value: &str) -> Result<RawFd, ConfigError> {
    match value.parse::<RawFd>() {
        Ok(fd) if fd >= 3 => Ok(fd),
        _ => err(format!("{flag} needs a descriptor number of 3 or more")),
    }
}

fn non_empty_path(flag: &str, value: String) -> Result<PathBuf, ConfigError> {
    if value.is_empty() {
        err(format!("{flag} needs a path"))
    } else {
        Ok(PathBuf::from(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, ConfigError> {
        Config::parse(args.iter().copied(), PathBuf::from("/home/u"))
    }

    #[test]
    fn inherited_descriptors_parse_with_defaults() {
        let c = parse(&["serve", "--listen-fd", "3", "--activation-fd", "4"]).unwrap();
        assert_eq!(c.listen, ListenSource::Fd(3));
        assert_eq!(c.activation, ActivationSource::Fd(4));
        assert_eq!(c.home, PathBuf::from("/home/u"));
        assert_eq!(c.max_connections, 256);
    }

    #[test]
    fn paths_and_options_parse() {
        let c = parse(&[
            "serve",
            "--listen",
            "/tmp/s",
            "--activation-file",
            "/tmp/a",
            "--home",
            "/w",
            "--max-connections",
            "4",
        ])
        .unwrap();
        assert_eq!(c.listen, ListenSource::Path("/tmp/s".into()));
        assert_eq!(c.activation, ActivationSource::File("/tmp/a".into()));
        assert_eq!(c.home, PathBuf::from("/w"));
        assert_eq!(c.max_connections, 4);
    }

    #[test]
    fn bad_command_lines_are_refused_before_anything_opens() {
        for bad in [
            &[][..],
            &["run"],
            &["serve"],
            &["serve", "--listen-fd", "3"],
            &["serve", "--listen-fd", "1", "--activation-fd", "4"],
            &["serve", "--listen-fd", "x", "--activation-fd", "4"],
            &["serve", "--listen-fd", "3", "--activation-fd", "3"],
            &[
                "serve",
                "--listen-fd",
                "3",
                "--listen",
                "/s",
                "--activation-fd",
                "4",
            ],
            &[
                "serve",
                "--listen-fd",
                "3",
                "--activation-fd",
                "4",
                "--home",
                "rel",
            ],
            &[
                "serve",
                "--listen-fd",
                "3",
                "--activation-fd",
                "4",
                "--max-connections",
                "0",
            ],
            &[
                "serve",
                "--listen-fd",
                "3",
                "--activation-fd",
                "4",
                "--bogus",
                "1",
            ],
            &["serve", "--listen-fd", "3", "--activation-fd"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn default_home_is_root_for_uid_0() {
        assert_eq!(default_home(0, Some("/x")), PathBuf::from("/root"));
        assert_eq!(
            default_home(1000, Some("/home/a")),
            PathBuf::from("/home/a")
        );
        assert_eq!(default_home(1000, Some("rel")), PathBuf::from("/"));
        assert_eq!(default_home(1000, None), PathBuf::from("/"));
    }
}
