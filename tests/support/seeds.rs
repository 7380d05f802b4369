//! A number from the environment for a seeded run (a seed, a count, a time): the simulator
//! and the PostgreSQL schedules read theirs alike.

/// The number `name` holds, `random` for a new one; `None` when it is not set. Anything else
/// is a mistake of whoever set it, said as such.
pub fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    if value == "random" {
        return Some(rand::random());
    }
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number or `random`")),
    )
}
