//! The order ids of `queue` and `stream`, which the admission script
//! composes from Redis's clock and a number the node hands it: the numbers
//! come from one MySQL counter (`tb_order_id_block`), leased a block at a
//! time by each node, so that an id is never handed out twice whatever
//! Redis forgets — a counter kept in Redis goes back with it, and a buyer
//! after a failover was answered an id another buyer had been told.

use std::sync::Mutex;

use crate::error::Error;
use crate::shards::{Shard, SEQUENCE_BITS};
use crate::store::Store;

/// How many numbers a node leases at once: one MySQL round trip per this
/// many admissions, and as many admissions as a node can still number
/// while MySQL is down once it holds a block.
pub const ID_BLOCK: u64 = 1 << 16;

/// The numbers leased and not yet handed out, `next..end`.
#[derive(Debug, Default)]
struct Block {
    next: u64,
    end: u64,
}

/// Hands out this node's order-id numbers.
pub struct OrderIds {
    store: Store,
    block: Mutex<Block>,
    /// One lease at a time: purchases that find the block used up wait for
    /// it rather than each leasing a block of its own.
    leasing: tokio::sync::Mutex<()>,
}

impl OrderIds {
    pub fn new(store: Store) -> Self {
        OrderIds {
            store,
            block: Mutex::new(Block::default()),
            leasing: tokio::sync::Mutex::new(()),
        }
    }

    /// The low word of a new order id admitted in `shard` (the admission
    /// script puts Redis's clock above it): the shard's base, then a number
    /// no node was handed before, modulo 2^24. Two ids meet only if 2^24
    /// numbers were leased between them within one second.
    pub async fn next_low_word(&self, shard: Shard) -> Result<u64, Error> {
        let number = self.next_number().await?;
        Ok(shard.sequence_base() + number % (1 << SEQUENCE_BITS))
    }

    async fn next_number(&self) -> Result<u64, Error> {
        loop {
            if let Some(number) = self.take() {
                return Ok(number);
            }
            let _one_lease = self.leasing.lock().await;
            if self.has_left() {
                continue;
            }
            // Leased in one statement: a lease whose answer is lost (the
            // future dropped, the connection cut) leaves a gap, never a
            // number handed out twice.
            let first = self.store.lease_order_ids(ID_BLOCK).await?;
            let mut block = self.block.lock().expect("order ids poisoned");
            *block = Block {
                next: first,
                end: first + ID_BLOCK,
            };
        }
    }

    /// The next number of the block, if any is left.
    fn take(&self) -> Option<u64> {
        let mut block = self.block.lock().expect("order ids poisoned");
        (block.next < block.end).then(|| {
            block.next += 1;
            block.next - 1
        })
    }

    /// Whether a number is left (another purchase leased while this one
    /// waited for the lease).
    fn has_left(&self) -> bool {
        let block = self.block.lock().expect("order ids poisoned");
        block.next < block.end
    }
}
