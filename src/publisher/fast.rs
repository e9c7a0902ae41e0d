//! JetStream fast-ingest batches (ADR-50 "fast ingest", nats-server 2.14+, a stream with
//! `allow_batched`), driven on a plain client connection.
//!
//! The protocol, as the server speaks it:
//! - Every message of a batch carries a reply subject `<inbox>.<flow>.fail.<seq>.<op>.$FI`:
//!   `<inbox>` is a two-token inbox that names the batch (`_INBOX.<id>`), `<flow>` how often the
//!   publisher asks for an ack (every `flow` messages; the server may lower it), `fail` the gap
//!   mode (the server ends the batch at the first message that is lost or refused, so nothing
//!   after it is stored), `<seq>` the message's place in the batch (from 1) and `<op>` what it
//!   does: 0 starts the batch, 1 appends, 3 ends it without being stored itself (end of batch),
//!   4 asks for the latest flow ack again (a ping after a lost ack).
//! - The server answers on those reply subjects (one subscription on `<inbox>.>` takes them):
//!   `{"type":"ack","seq":N,"msgs":F}` once the batch started (`seq` 0) and every `F` messages
//!   (messages 1..=N stored; `F` the flow from then on); `{"type":"gap",..}` when a message was
//!   lost; an API error (`{"error":..}`, or `{"type":"err","seq":N,"error":..}`) for a message the
//!   stream refused, its sequence in the reply subject; a no-responders status when no stream
//!   captures a subject; and, when the batch ends (its end-of-batch message, or the message after
//!   the one that stopped it), the final ack `{"stream":..,"seq":..,"batch":..,"count":N}`: the
//!   batch's first N messages are stored, and no later one is.
//! - The publisher keeps at most `flow * outstanding` messages beyond the last flow ack in flight
//!   (ADR-50's flow control), and pings when an ack is late.
//!
//! [`publish`] reports how many of its messages (a prefix, in order) the server confirmed it
//! stored, from the final ack or, without one, from the last flow ack: never from a message merely
//! sent.
//!
//! The file depends on async-nats, serde and tokio only: the bench compiles it as it is.

use std::time::Duration;

use async_nats::jetstream;
use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use serde::Deserialize;

/// One message of a batch.
pub(crate) struct Message {
    pub subject: String,
    pub headers: async_nats::HeaderMap,
    pub payload: Bytes,
}

/// Flow control of a batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Flow {
    /// An ack asked for every `every` messages (the server may lower it).
    pub every: u16,
    /// Flow acks outstanding before the publisher waits (ADR-50: 1 to 3).
    pub outstanding: u16,
    /// Bound on each wait for the server (the first ack, a late flow ack, the final ack).
    pub timeout: Duration,
}

/// The flow the relay asks for: an ack every 200 messages, two outstanding (400 messages beyond
/// the last ack in flight).
pub(crate) const DEFAULT_FLOW: Flow = Flow {
    every: 200,
    outstanding: 2,
    timeout: Duration::from_secs(5),
};

/// Why a batch stopped before its end.
#[derive(Debug)]
pub(crate) enum Stop {
    /// The stream refused message `index` (its API error); nothing after it was stored.
    Refused {
        index: usize,
        error: jetstream::Error,
    },
    /// No stream captures the subject of message `index`.
    NoResponders { index: usize },
    /// The batch itself failed: not enabled on the stream, too many batches, a lost message, the
    /// connection. The broker's, never a message's.
    Broker(String),
    /// The server did not answer in time.
    TimedOut(String),
}

/// What a batch got stored.
#[derive(Debug)]
pub(crate) struct Report {
    /// Messages `0..stored` are confirmed stored (duplicates the stream dropped by `Nats-Msg-Id`
    /// count as stored: they are in the stream).
    pub stored: usize,
    /// Why the batch stopped early (`None`: every message is stored).
    pub stop: Option<Stop>,
}

/// Fast-ingest operations, as the reply subject carries them.
const OP_START: u8 = 0;
const OP_APPEND: u8 = 1;
const OP_END_OF_BATCH: u8 = 3;
const OP_PING: u8 = 4;

/// The server's flow-control messages (they carry a `type`).
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum Control {
    Ack { seq: u64, msgs: u16 },
    Gap { last_seq: u64, seq: u64 },
    Err { seq: u64, error: jetstream::Error },
}

/// The final ack of a batch.
#[derive(Deserialize)]
struct FinalAck {
    count: u64,
}

/// Whether an API error is about the batch (the broker's) rather than one message.
fn batch_level(code: jetstream::ErrorCode) -> bool {
    use jetstream::ErrorCode as C;
    matches!(
        code,
        C::BATCH_PUBLISH_DISABLED
            | C::BATCH_PUBLISH_INVALID_PATTERN
            | C::BATCH_PUBLISH_INVALID_BATCH_ID
            | C::BATCH_PUBLISH_UNKNOWN_BATCH_ID
            | C::BATCH_PUBLISH_TOO_MANY_INFLIGHT
    )
}

/// The batch sequence a reply subject `<inbox>.<flow>.<gap>.<seq>.<op>.$FI` names.
fn reply_seq(subject: &str) -> Option<u64> {
    let mut tokens = subject.rsplit('.');
    let _fi = tokens.next()?;
    let _op = tokens.next()?;
    tokens.next()?.parse().ok()
}

/// A batch in progress: what the server said so far.
struct State {
    /// Highest sequence a flow ack covered.
    acked: u64,
    /// The flow the server asked for.
    every: u16,
    /// The server acked the start.
    started: bool,
    /// The final ack's count.
    finished: Option<u64>,
    stop: Option<Stop>,
}

impl State {
    /// Takes in one answer of the server's.
    fn take(&mut self, msg: async_nats::Message) {
        let seq = reply_seq(msg.subject.as_str());
        if msg.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
            self.stop_with(match seq {
                Some(seq) if seq >= 1 => Stop::NoResponders {
                    index: (seq - 1) as usize,
                },
                _ => Stop::Broker("no responders for the batch".into()),
            });
            return;
        }
        if let Ok(control) = serde_json::from_slice::<Control>(&msg.payload) {
            match control {
                Control::Ack { seq, msgs } => {
                    self.started = true;
                    self.acked = self.acked.max(seq);
                    self.every = msgs.max(1);
                }
                Control::Gap { last_seq, seq } => self.stop_with(Stop::Broker(format!(
                    "fast-ingest batch lost messages in transit (after {last_seq}, at {seq}): the server ended it"
                ))),
                Control::Err { seq, error } => self.refused(Some(seq), error),
            }
            return;
        }
        match serde_json::from_slice::<jetstream::response::Response<FinalAck>>(&msg.payload) {
            Ok(jetstream::response::Response::Ok(ack)) => self.finished = Some(ack.count),
            Ok(jetstream::response::Response::Err { error }) => self.refused(seq, error),
            Err(e) => self.stop_with(Stop::Broker(format!(
                "unreadable fast-ingest answer ({e}): {}",
                String::from_utf8_lossy(&msg.payload)
            ))),
        }
    }

    fn refused(&mut self, seq: Option<u64>, error: jetstream::Error) {
        let stop = match seq {
            Some(seq) if seq >= 1 && !batch_level(error.error_code()) => Stop::Refused {
                index: (seq - 1) as usize,
                error,
            },
            _ => Stop::Broker(format!("fast-ingest batch refused: {error}")),
        };
        self.stop_with(stop);
    }

    /// The first reason the batch stopped is the one that counts.
    fn stop_with(&mut self, stop: Stop) {
        if self.stop.is_none() {
            self.stop = Some(stop);
        }
    }

    /// Whether message `seq` must wait for a flow ack first.
    fn stalled(&self, seq: u64, outstanding: u16) -> bool {
        let window = self
            .acked
            .saturating_add(u64::from(self.every).saturating_mul(u64::from(outstanding)));
        window <= seq
    }
}

/// The batch's connection, inbox and subscription.
struct Batch<'a> {
    client: &'a async_nats::Client,
    prefix: String,
    sub: async_nats::Subscriber,
    state: State,
    flow: Flow,
}

impl Batch<'_> {
    fn reply(&self, seq: u64, op: u8) -> String {
        format!("{}{seq}.{op}.$FI", self.prefix)
    }

    /// Takes in whatever the server already answered, without waiting.
    fn poll_answers(&mut self) -> std::result::Result<(), Stop> {
        while let Some(next) = self.sub.next().now_or_never() {
            match next {
                Some(msg) => self.state.take(msg),
                None => return Err(Stop::Broker("the batch's subscription ended".into())),
            }
        }
        Ok(())
    }

    /// Waits up to the timeout for one answer; `false` when none came.
    async fn wait_answer(&mut self, wait: Duration) -> std::result::Result<bool, Stop> {
        match tokio::time::timeout(wait, self.sub.next()).await {
            Ok(Some(msg)) => {
                self.state.take(msg);
                Ok(true)
            }
            Ok(None) => Err(Stop::Broker("the batch's subscription ended".into())),
            Err(_) => Ok(false),
        }
    }

    /// Waits until `done` holds, a stop, or the timeout (pinging the server for the latest flow
    /// ack twice on the way, in case one was lost).
    async fn wait_until(
        &mut self,
        what: &str,
        ping: Option<(&str, u64)>,
        done: impl Fn(&State) -> bool,
    ) -> std::result::Result<(), Stop> {
        let deadline = tokio::time::Instant::now() + self.flow.timeout;
        let interval = (self.flow.timeout / 3).max(Duration::from_millis(100));
        while !done(&self.state) && self.state.stop.is_none() {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(Stop::TimedOut(format!(
                    "no fast-ingest {what} within {:?}",
                    self.flow.timeout
                )));
            }
            let wait = interval.min(deadline - now);
            if !self.wait_answer(wait).await? {
                if let Some((subject, seq)) = ping {
                    let reply = self.reply(seq, OP_PING);
                    self.client
                        .publish_with_reply(subject.to_string(), reply, Bytes::new())
                        .await
                        .map_err(|e| Stop::Broker(format!("cannot send a ping: {e}")))?;
                }
            }
        }
        Ok(())
    }
}

/// Publishes `messages` as one fast-ingest batch and reports how many the server stored.
pub(crate) async fn publish(
    client: &async_nats::Client,
    messages: Vec<Message>,
    flow: Flow,
) -> Report {
    let total = messages.len();
    let mut state = State {
        acked: 0,
        every: flow.every.max(1),
        started: false,
        finished: None,
        stop: None,
    };
    let Some(first) = messages.first().map(|m| m.subject.clone()) else {
        return Report {
            stored: 0,
            stop: None,
        };
    };
    let inbox = client.new_inbox();
    // The server reads the batch id from the reply subject's tokens: the inbox must be two.
    if inbox.split('.').count() != 2 {
        state.stop = Some(Stop::Broker(format!(
            "fast-ingest batches need a two-token inbox, not {inbox}"
        )));
        return conclude(state, total, 0);
    }
    let sub = match client.subscribe(format!("{inbox}.>")).await {
        Ok(sub) => sub,
        Err(e) => {
            state.stop = Some(Stop::Broker(format!(
                "cannot subscribe to the batch's inbox: {e}"
            )));
            return conclude(state, total, 0);
        }
    };
    let mut batch = Batch {
        client,
        prefix: format!("{inbox}.{}.fail.", flow.every.max(1)),
        sub,
        state,
        flow,
    };
    let mut sent: u64 = 0;
    let outcome = send_all(&mut batch, messages, &first, &mut sent).await;
    if let Err(stop) = outcome {
        batch.state.stop_with(stop);
    }
    // The final ack comes with the message after the last one (the end of batch, or the message
    // after the one that stopped it): send the end of batch unless the final ack is already in.
    if batch.state.finished.is_none() && sent > 0 {
        let reply = batch.reply(sent + 1, OP_END_OF_BATCH);
        match client
            .publish_with_reply(first.clone(), reply, Bytes::new())
            .await
        {
            Ok(()) => {
                let stopped = batch.state.stop.is_some();
                let wait = batch
                    .wait_until("final ack", None, |s| s.finished.is_some())
                    .await;
                // After a stop, the final ack only tells how much was stored: its absence is no
                // new failure (and the end of batch may meet an "unknown batch" then).
                if let Err(stop) = wait {
                    if !stopped {
                        batch.state.stop_with(stop);
                    }
                }
            }
            Err(e) => batch
                .state
                .stop_with(Stop::Broker(format!("cannot end the batch: {e}"))),
        }
    }
    let _ = batch.sub.unsubscribe().await;
    conclude(batch.state, total, sent)
}

/// Sends every message under flow control; stops at the first answer that ends the batch.
async fn send_all(
    batch: &mut Batch<'_>,
    messages: Vec<Message>,
    first: &str,
    sent: &mut u64,
) -> std::result::Result<(), Stop> {
    for message in messages {
        batch.poll_answers()?;
        if batch.state.stop.is_some() || batch.state.finished.is_some() {
            return Ok(());
        }
        let seq = *sent + 1;
        if batch.state.stalled(seq, batch.flow.outstanding) {
            let outstanding = batch.flow.outstanding;
            batch
                .wait_until("flow ack", Some((first, *sent)), |s| {
                    !s.stalled(seq, outstanding)
                })
                .await?;
            if batch.state.stop.is_some() {
                return Ok(());
            }
        }
        let op = if seq == 1 { OP_START } else { OP_APPEND };
        let reply = batch.reply(seq, op);
        batch
            .client
            .publish_with_reply_and_headers(
                message.subject,
                reply,
                message.headers,
                message.payload,
            )
            .await
            .map_err(|e| Stop::Broker(format!("cannot send a batch message: {e}")))?;
        *sent = seq;
        if seq == 1 {
            // The batch exists once the server acked its start (or said why not).
            batch
                .wait_until("start", None, |s| s.started || s.finished.is_some())
                .await?;
        }
    }
    Ok(())
}

/// The report: the final ack's count when it came, else the last flow ack; never past a message
/// the server refused.
fn conclude(state: State, total: usize, sent: u64) -> Report {
    let confirmed = state.finished.unwrap_or(state.acked).min(sent);
    let mut stored = usize::try_from(confirmed).unwrap_or(total).min(total);
    if let Some(Stop::Refused { index, .. } | Stop::NoResponders { index }) = &state.stop {
        stored = stored.min(*index);
    }
    let stop = match state.stop {
        Some(stop) => Some(stop),
        None if stored < total => Some(Stop::Broker(format!(
            "the fast-ingest batch ended after {stored} of {total} messages"
        ))),
        None => None,
    };
    Report { stored, stop }
}

#[cfg(test)]
mod tests {
    // The bench compiles this file in test mode without running its tests.
    #[allow(unused_imports)]
    use super::*;

    /// A batch's state before any answer (asked for an ack every 100 messages).
    #[allow(dead_code)]
    fn fresh() -> State {
        State {
            acked: 0,
            every: 100,
            started: false,
            finished: None,
            stop: None,
        }
    }

    #[test]
    fn the_reply_subject_names_the_batch_sequence() {
        assert_eq!(reply_seq("_INBOX.abc.100.fail.42.1.$FI"), Some(42));
        assert_eq!(reply_seq("_INBOX.abc.100.fail.1.0.$FI"), Some(1));
        assert_eq!(reply_seq("$FI"), None);
    }

    #[test]
    fn flow_control_waits_at_the_window() {
        let state = State {
            acked: 10,
            every: 10,
            started: true,
            finished: None,
            stop: None,
        };
        assert!(!state.stalled(29, 2));
        assert!(state.stalled(30, 2));
    }

    #[test]
    fn only_the_servers_confirmations_count() {
        let state = |acked, finished, stop| State {
            acked,
            every: 100,
            started: true,
            finished,
            stop,
        };
        // The final ack's count.
        let r = conclude(state(0, Some(5), None), 5, 5);
        assert_eq!(r.stored, 5);
        assert!(r.stop.is_none());
        // No final ack: the last flow ack only, and the rest is a failure.
        let r = conclude(state(4, None, None), 10, 10);
        assert_eq!(r.stored, 4);
        assert!(matches!(r.stop, Some(Stop::Broker(_))));
        // Never past a refused message.
        let error: jetstream::Error =
            serde_json::from_str(r#"{"code":400,"err_code":10054,"description":"too big"}"#)
                .expect("an API error");
        let r = conclude(
            state(0, Some(7), Some(Stop::Refused { index: 2, error })),
            10,
            10,
        );
        assert_eq!(r.stored, 2);
    }

    #[test]
    fn answers_are_read_as_the_server_sends_them() {
        let msg = |subject: &str, payload: &str| async_nats::Message {
            subject: subject.into(),
            reply: None,
            payload: Bytes::from(payload.to_string()),
            headers: None,
            status: None,
            description: None,
            length: 0,
        };
        let mut state = fresh();
        state.take(msg(
            "_INBOX.a.100.fail.1.0.$FI",
            r#"{"type":"ack","seq":0,"msgs":50}"#,
        ));
        assert!(state.started);
        assert_eq!(state.every, 50);
        state.take(msg(
            "_INBOX.a.100.fail.3.1.$FI",
            r#"{"error":{"code":400,"err_code":10054,"description":"message size exceeds maximum allowed"},"stream":"S","seq":0}"#,
        ));
        assert!(matches!(state.stop, Some(Stop::Refused { index: 2, .. })));
        state.take(msg(
            "_INBOX.a.100.fail.4.1.$FI",
            r#"{"stream":"S","seq":10,"batch":"a","count":2}"#,
        ));
        assert_eq!(state.finished, Some(2));
        let mut state = fresh();
        state.take(msg(
            "_INBOX.a.100.fail.1.0.$FI",
            r#"{"error":{"code":400,"err_code":10205,"description":"batch publish not enabled"}}"#,
        ));
        assert!(matches!(state.stop, Some(Stop::Broker(_))));
    }
}
