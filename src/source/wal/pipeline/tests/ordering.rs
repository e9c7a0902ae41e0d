//! Rows carried (not visible yet) and parked (behind an older row the stream has not brought):
//! commit order kept, the slot held only until they are resolved.

use super::*;

/// The two defects found by careful operators, as unit tests of the pipeline.
#[test]
fn a_row_not_visible_is_carried_while_its_aggregate_goes_to_the_table_and_back() {
    let mut p = Pipeline::new([key(0)]);
    let row = Candidate {
        transaction: None,
        id: Uuid::new_v4(),
        aggregate: key(0),
        xid: 1,
        size: 1,
        content: None,
    };
    p.stream(Change::Begin);
    p.stream(Change::Insert(row.clone()));
    p.stream(Change::Commit { end: 10 });
    let cut = p.cut(10, 10).expect("a batch");
    p.claimed(
        cut.batch,
        &HashMap::from([(row.id, Found::NotVisible)]),
        &HashMap::new(),
        &HashMap::new(),
        0,
    );
    assert!(p.publish(cut.batch).is_empty());
    assert!(p.settled(cut.batch, &HashSet::new()).is_empty());
    p.recorded(cut.batch);
    assert_eq!(p.confirm(), None, "the slot waits for the row");
    // The table has no pending row of the aggregate: it goes back to the stream, frozen (the
    // stream holds a row of it).
    let round = p.serve(vec![key(0)]);
    assert!(round.frozen.contains(&key(0)));
    p.undefer(&round.aggregates);
    // Visible now: it goes out from the stream.
    let cut = p.cut(10, 10).expect("claimed again");
    p.claimed(
        cut.batch,
        &HashMap::from([(row.id, Found::Claimed)]),
        &HashMap::new(),
        &HashMap::new(),
        0,
    );
    assert_eq!(p.publish(cut.batch), [vec![row.id]]);
    p.settled(cut.batch, &HashSet::from([row.id]));
    p.recorded(cut.batch);
    assert_eq!(p.confirm(), Some(10));
}

#[test]
fn a_carried_row_keeps_the_slot_waiting_only_until_it_is_resolved() {
    let mut p = Pipeline::new([]);
    let rows: Vec<Candidate> = (0..2)
        .map(|_| Candidate {
            transaction: None,
            id: Uuid::new_v4(),
            aggregate: key(0),
            xid: 1,
            size: 1,
            content: None,
        })
        .collect();
    for (n, r) in rows.iter().enumerate() {
        p.stream(Change::Begin);
        p.stream(Change::Insert(r.clone()));
        p.stream(Change::Commit {
            end: 10 * (n as u64 + 1),
        });
    }
    // The first fails (its aggregate goes to the table), the second is not visible yet.
    let cut = p.cut(10, 10).expect("a batch");
    p.claimed(
        cut.batch,
        &HashMap::from([
            (rows[0].id, Found::Claimed),
            (rows[1].id, Found::NotVisible),
        ]),
        &HashMap::new(),
        &HashMap::new(),
        0,
    );
    assert_eq!(p.publish(cut.batch), [vec![rows[0].id]]);
    assert_eq!(p.settled(cut.batch, &HashSet::new()), [key(0)]);
    p.recorded(cut.batch);
    assert_eq!(p.confirm(), Some(10), "the first is with the table");
    // Visible now, its aggregate with the table: the table takes it; the slot moves on.
    let cut = p.cut(10, 10).expect("claimed again");
    p.claimed(
        cut.batch,
        &HashMap::from([(rows[1].id, Found::Claimed)]),
        &HashMap::new(),
        &HashMap::new(),
        0,
    );
    assert!(p.publish(cut.batch).is_empty());
    p.settled(cut.batch, &HashSet::new());
    p.recorded(cut.batch);
    assert_eq!(p.confirm(), Some(20));
}

/// A row behind an older row of its aggregate that the stream has not brought (committed after
/// it) is parked: out of the read-ahead (the stream keeps moving, however long it goes without a
/// commit, as through one transaction larger than the read-ahead) and not claimed again until the
/// stream proves something. The stream bringing the older row: the row goes out first (commit
/// order). The stream passing the position where the older row would be: the table takes the
/// aggregate (the older row is in no stream). Before, rows waiting like this that filled the
/// read-ahead while no commit came sent their aggregate to the table, reversing commit order.
#[test]
fn a_row_behind_an_older_row_the_stream_has_not_brought_waits_for_the_stream() {
    let (high, older) = (row(0), row(0));
    let mut p = Pipeline::new([]);
    p.stream(Change::Begin);
    p.stream(Change::Insert(high.clone()));
    p.stream(Change::Commit { end: 10 });
    let prev = HashMap::from([(high.id, older.id)]);
    let cut = p.cut(1, 10).expect("a batch");
    let claimed = HashMap::from([(high.id, Found::Claimed)]);
    p.claimed(cut.batch, &claimed, &HashMap::new(), &prev, 100);
    assert!(p.publish(cut.batch).is_empty(), "the older row may come");
    assert!(p.settled(cut.batch, &HashSet::new()).is_empty());
    p.recorded(cut.batch);
    assert_eq!((p.parked(), p.queued().0), (1, 0), "parked, not read-ahead");
    // One transaction far larger than the read-ahead (a batch of one): its rows go out while the
    // parked row waits, whatever their number and though no commit comes.
    p.stream(Change::Begin);
    for _ in 0..50 {
        p.stream(Change::Insert(row(1)));
        let cut = p.cut(1, 10).expect("the big transaction's row");
        assert_ne!(cut.rows[0].id, high.id, "parked rows are not claimed again");
        let found = HashMap::from([(cut.rows[0].id, Found::Claimed)]);
        p.claimed(cut.batch, &found, &HashMap::new(), &HashMap::new(), 100);
        assert_eq!(p.publish(cut.batch).len(), 1);
        let ids: HashSet<Uuid> = cut.rows.iter().map(|r| r.id).collect();
        assert!(
            p.settled(cut.batch, &ids).is_empty(),
            "nothing to the table"
        );
        p.recorded(cut.batch);
    }
    p.stream(Change::Commit { end: 50 });
    assert_eq!(p.parked(), 1, "the stream has not passed 100");
    // The older row comes: the parked row is claimed again, and goes out first.
    p.stream(Change::Begin);
    p.stream(Change::Insert(older.clone()));
    assert_eq!(p.parked(), 0);
    let cut = p.cut(10, 10).expect("both");
    assert_eq!(cut.rows[0].id, high.id);
    let found = HashMap::from([(high.id, Found::Claimed), (older.id, Found::Claimed)]);
    p.claimed(cut.batch, &found, &HashMap::new(), &prev, 100);
    assert_eq!(
        p.publish(cut.batch),
        [vec![high.id, older.id]],
        "commit order"
    );

    // Another row waiting so: the stream passes its position, and its aggregate goes to the table.
    let lone = row(2);
    let mut p = Pipeline::new([]);
    p.stream(Change::Begin);
    p.stream(Change::Insert(lone.clone()));
    p.stream(Change::Commit { end: 10 });
    let prev = HashMap::from([(lone.id, Uuid::new_v4())]);
    let claimed = HashMap::from([(lone.id, Found::Claimed)]);
    let cut = p.cut(10, 10).expect("a batch");
    p.claimed(cut.batch, &claimed, &HashMap::new(), &prev, 20);
    assert!(p.publish(cut.batch).is_empty());
    assert!(p.settled(cut.batch, &HashSet::new()).is_empty());
    p.recorded(cut.batch);
    assert!(p.cut(10, 10).is_none(), "parked");
    p.stream(Change::Idle { wal_end: 20 });
    let cut = p
        .cut(10, 10)
        .expect("claimed again once the stream passed 20");
    p.claimed(cut.batch, &claimed, &HashMap::new(), &prev, 30);
    assert!(p.publish(cut.batch).is_empty());
    assert_eq!(
        p.settled(cut.batch, &HashSet::new()),
        [key(2)],
        "the older row is in no stream: the table takes the aggregate"
    );
    p.recorded(cut.batch);
    assert_eq!(p.confirm(), Some(20));
}
