//! Rows parked outside the read-ahead until the stream proves something about them (see
//! `Pipeline::parked`).

use super::Pipeline;

impl Pipeline {
    /// Rows parked (not queued) waiting for the stream.
    #[cfg(test)]
    pub fn parked(&self) -> usize {
        self.parked.len()
    }

    /// Claims again the parked rows whose position the stream has passed.
    pub(super) fn unpark_passed(&mut self) {
        while let Some(&(since, index)) = self.parked.first() {
            if since > self.streamed_to {
                break;
            }
            if let Some((awaited, _)) = self.rows.get(&index).and_then(|t| t.park) {
                if let Some(list) = self.awaited.get_mut(&awaited) {
                    list.retain(|i| *i != index);
                    if list.is_empty() {
                        self.awaited.remove(&awaited);
                    }
                }
            }
            self.unpark(index);
        }
    }

    /// A parked row back in the queue (carried: claimed again after a short pause).
    pub(super) fn unpark(&mut self, index: u64) {
        let Some(since) = self.rows.get_mut(&index).and_then(|t| t.park.take()) else {
            return;
        };
        self.parked.remove(&(since.1, index));
        self.requeue(index, true);
    }

    /// A row the claim found waiting for the stream leaves the queue until the stream proves
    /// something about it (see `parked`).
    pub(super) fn park(&mut self, index: u64) {
        let Some((awaited, since)) = self.rows.get(&index).and_then(|t| t.park) else {
            self.requeue(index, true);
            return;
        };
        let brought = || self.rows.values().any(|t| t.row.id == awaited);
        if since <= self.streamed_to || brought() {
            // Passed already, or the stream brought the row since the claim: claim it again.
            if let Some(t) = self.rows.get_mut(&index) {
                t.park = None;
            }
            self.requeue(index, true);
            return;
        }
        if let Some(t) = self.rows.get_mut(&index) {
            t.batch = None;
            t.carried = true;
        }
        self.parked.insert((since, index));
        self.awaited.entry(awaited).or_default().push(index);
    }
}
