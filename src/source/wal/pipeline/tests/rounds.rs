//! The sweep's rounds: what they serve comes from the durable record.

use super::*;

/// What a round serves comes from the durable record: an aggregate this pipeline never deferred
/// (recorded by another relay, a script, or with rows the sweep found moved) is learnt, and the
/// next round starts after the last one served, among thousands deferred.
#[test]
fn a_round_serves_what_the_record_says_and_memory_learns_it() {
    let deferred: Vec<AggregateKey> = (0..5_000)
        .map(|i| ("order".into(), format!("h{i:05}")))
        .collect();
    let mut p = Pipeline::new(deferred.iter().cloned());
    assert_eq!(
        p.cursor(),
        AggregateKey::default(),
        "the first round starts at the start"
    );
    let stranger: AggregateKey = ("order".into(), "m7".into());
    assert!(!p.deferred().contains(&stranger));
    let round = p.serve(vec![deferred[4_321].clone(), stranger.clone()]);
    assert!(round.frozen.is_empty());
    assert!(p.deferred().contains(&stranger), "memory learns the record");
    assert_eq!(
        p.cursor(),
        stranger,
        "the next round starts after the last served"
    );
    // A round that serves nothing keeps the cursor.
    let round = p.serve(Vec::new());
    assert_eq!(round, Round::default());
    assert_eq!(p.cursor(), stranger);
    p.undefer(std::slice::from_ref(&stranger));
    assert!(!p.deferred().contains(&stranger));
}
