//! The pipeline's tests: the model of the world around it, driven through random interleavings
//! and the scenarios operators reproduced (`model/`), and unit tests by theme: rows carried and
//! parked in commit order (`ordering.rs`), the sweep's rounds (`rounds.rs`), the rows an atomic
//! completion takes (`atomic.rs`).

mod atomic;
mod model;
mod ordering;
mod rounds;

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use super::*;

fn key(a: u32) -> AggregateKey {
    ("order".into(), format!("a{a:05}"))
}

/// A new streamed row of aggregate `agg`.
fn row(agg: u32) -> Candidate {
    Candidate {
        transaction: None,
        id: Uuid::new_v4(),
        aggregate: key(agg),
        xid: 1,
        size: 1,
        content: None,
    }
}
