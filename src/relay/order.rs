//! The client's order on the wire: each message from the client takes a turn when it
//! arrives, and reaches the wire only once every earlier turn is over (its message is on the
//! wire, or it was answered without reaching it).
//!
//! A request is guarded before it is written (classified, recorded `dispatched` durably), and
//! a notification is not: without turns, a `notifications/cancelled` sent after its call would
//! reach the server first, and calls would reach it in the order their ledger writes ended.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex, PoisonError},
};

use tokio::sync::watch;

/// The turns of one client, in the order they were taken.
#[derive(Debug, Clone)]
pub(crate) struct Order(Arc<Turns>);

#[derive(Debug)]
struct Turns {
    taken: Mutex<Taken>,
    /// Every turn below this one is over.
    first_open: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct Taken {
    next: u64,
    /// Turns over while an earlier one is not.
    over: BTreeSet<u64>,
}

impl Default for Order {
    fn default() -> Self {
        Self(Arc::new(Turns {
            taken: Mutex::default(),
            first_open: watch::Sender::new(0),
        }))
    }
}

impl Order {
    /// The next turn, after every turn taken so far.
    pub(crate) fn take(&self) -> Turn {
        let mut taken = self.0.taken.lock().unwrap_or_else(PoisonError::into_inner);
        let number = taken.next;
        taken.next += 1;
        Turn {
            order: self.clone(),
            number,
        }
    }
}

/// One message's place in the client's order; dropping it ends the turn.
#[derive(Debug)]
pub(crate) struct Turn {
    order: Order,
    number: u64,
}

impl Turn {
    /// Waits until every earlier turn is over.
    pub(crate) async fn wait(&self) {
        let mut first_open = self.order.0.first_open.subscribe();
        // The sender lives as long as this turn's order: the wait ends only by its turn.
        let _ = first_open.wait_for(|first| *first >= self.number).await;
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let turns = &self.order.0;
        let mut taken = turns.taken.lock().unwrap_or_else(PoisonError::into_inner);
        taken.over.insert(self.number);
        let mut first = *turns.first_open.borrow();
        while taken.over.remove(&first) {
            first += 1;
        }
        turns.first_open.send_replace(first);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_turn_waits_for_every_earlier_turn_also_when_a_later_one_ends_first() {
        let order = Order::default();
        let first = order.take();
        let second = order.take();
        let third = order.take();
        drop(second);
        let waiting = tokio::spawn(async move { third.wait().await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the first turn is not over");
        drop(first);
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the third turn's wait ends once the first is over")
            .unwrap();
    }
}
