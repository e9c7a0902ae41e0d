//! The model's random interleavings: with every defence, and without each one.

use proptest::prelude::*;

use super::*;

/// Runs `ops` then settles, with `defences`.
fn run(defences: Defences, ops: Vec<Op>) {
    let mut world = World::new(defences);
    let mut p = Pipeline::new([]);
    for op in ops {
        world.step(&mut p, op);
    }
    world.settle_all(&mut p);
}

/// The model's runs: XorShift draws the steps (ChaCha, the default, takes most of a debug build's
/// time).
pub(super) fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        rng_algorithm: proptest::test_runner::RngAlgorithm::XorShift,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(3000))]

    #[test]
    fn the_pipeline_loses_and_reorders_nothing(ops in prop::collection::vec(op(), 0..120)) {
        run(ALL, ops);
    }
}

const SEED: [u8; 16] = *b"\x01odel-of-the-wal";

/// The model finds what each defence is for: with any one of them taken away, some interleaving
/// loses or strands an event, or lets one overtake an older one of its aggregate.
#[test]
fn without_any_one_defence_the_model_finds_a_defect() {
    use proptest::test_runner::{Config, RngAlgorithm, TestError, TestRng, TestRunner};
    for (name, defences) in [
        (
            "aggregates found deferred at start recorded",
            Defences {
                record_at_start: false,
                ..ALL
            },
        ),
        (
            "the claim's checks (older pending row, moved row)",
            Defences {
                claim_checks: false,
                ..ALL
            },
        ),
        (
            "the stream's fallback",
            Defences {
                fallback: false,
                ..ALL
            },
        ),
    ] {
        // A fixed seed: the same interleavings every run (a search that may miss is no test).
        let mut runner = TestRunner::new_with_rng(
            Config {
                failure_persistence: None,
                ..config(3000)
            },
            TestRng::from_seed(RngAlgorithm::XorShift, &SEED),
        );
        let found = runner.run(&prop::collection::vec(op(), 0..120), |ops| {
            run(defences, ops);
            Ok(())
        });
        match found {
            Err(TestError::Fail(why, ops)) => {
                eprintln!("without {name}: {why}; {} steps: {ops:?}", ops.len())
            }
            other => panic!("without {name} the model found nothing: {other:?}"),
        }
    }
}
