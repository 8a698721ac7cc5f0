//! The SPACE guest agent.
