//! [`RetryConfig`]: attempts and backoff of a failing row.

use std::time::Duration;

use crate::error::{Error, Result};

use super::positive;

/// Retries: how often a failing row is tried and how long it waits in between.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RetryConfig {
    /// A row failing this many times is dead-lettered.
    pub max_attempts: u32,
    /// First retry delay of a failed row; doubles (with jitter) up to `max`.
    pub initial: Duration,
    /// Longest retry delay of a failed row.
    pub max: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: 10,
            initial: Duration::from_secs(1),
            max: Duration::from_secs(300),
        }
    }
}

impl RetryConfig {
    /// Refuses attempts and delays the policy cannot work with.
    pub fn validate(&self) -> Result<()> {
        if self.max_attempts == 0 {
            return Err(Error::config("max_attempts", "must be at least 1"));
        }
        positive("retry_initial", self.initial)?;
        if self.max < self.initial {
            return Err(Error::config(
                "retry_max",
                "must not be shorter than retry_initial",
            ));
        }
        Ok(())
    }
}
