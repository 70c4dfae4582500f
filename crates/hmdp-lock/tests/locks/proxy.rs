//! A TCP proxy in front of a Redis server whose traffic a test holds back,
//! one direction at a time, without closing any connection: a slow link, a
//! late reply, or (both directions held) a peer gone silent.

use std::sync::Arc;

use hmdp_test_support::{Direction, Faults, TcpProxy, Verdict};
use tokio::sync::watch;

/// Proxies every connection it accepts to one upstream; stops with the
/// test's runtime.
pub struct Proxy {
    proxy: TcpProxy,
    gates: Arc<Gates>,
}

/// The proxy's faults: a gate each way.
struct Gates {
    /// Client to server.
    requests: Gate,
    /// Server to client.
    replies: Gate,
}

impl Gates {
    fn of(&self, direction: Direction) -> &Gate {
        match direction {
            Direction::Requests => &self.requests,
            Direction::Replies => &self.replies,
        }
    }
}

impl Faults for Gates {
    /// Counts the chunk in, then holds it while its gate is closed.
    async fn chunk(&self, _connection: u64, direction: Direction, _chunk: &[u8]) -> Verdict {
        let gate = self.of(direction);
        let mut open = gate.open.subscribe();
        gate.arrived.send_modify(|arrived| *arrived += 1);
        let opened = open.wait_for(|&open| open).await.is_ok();
        if opened {
            Verdict::Pass
        } else {
            Verdict::Close
        }
    }

    fn passed(&self, _connection: u64, direction: Direction) {
        (self.of(direction).passed).send_modify(|passed| *passed += 1);
    }
}

/// One direction of every connection through the proxy.
pub struct Gate {
    open: watch::Sender<bool>,
    /// Chunks that reached the proxy so far, held or not, all connections
    /// counted.
    arrived: watch::Sender<u64>,
    /// Chunks that went through so far, all connections counted.
    passed: watch::Sender<u64>,
}

impl Proxy {
    /// Proxies to the server listening on `upstream_port` on this machine.
    pub async fn start(upstream_port: u16) -> Proxy {
        let gates = Arc::new(Gates {
            requests: Gate::new(),
            replies: Gate::new(),
        });
        let proxy = TcpProxy::start(upstream_port, gates.clone()).await.unwrap();
        Proxy { proxy, gates }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.proxy.port())
    }

    pub fn requests(&self) -> &Gate {
        &self.gates.requests
    }

    pub fn replies(&self) -> &Gate {
        &self.gates.replies
    }
}

impl Gate {
    fn new() -> Gate {
        Gate {
            open: watch::Sender::new(true),
            arrived: watch::Sender::new(0),
            passed: watch::Sender::new(0),
        }
    }

    /// Bytes read from now on wait in the proxy until [`Gate::pass`].
    pub fn hold(&self) {
        self.open.send_replace(false);
    }

    pub fn pass(&self) {
        self.open.send_replace(true);
    }

    /// Chunks that reached the proxy so far, held ones included.
    pub fn arrived(&self) -> u64 {
        *self.arrived.borrow()
    }

    /// Waits until more than `count` chunks reached the proxy.
    pub async fn arrived_more_than(&self, count: u64) {
        more_than(&self.arrived, count).await;
    }

    /// Chunks that went through so far.
    pub fn passed(&self) -> u64 {
        *self.passed.borrow()
    }

    /// Waits until more than `count` chunks went through.
    pub async fn passed_more_than(&self, count: u64) {
        more_than(&self.passed, count).await;
    }
}

/// Waits until `counter` is above `count`.
async fn more_than(counter: &watch::Sender<u64>, count: u64) {
    let _ = counter.subscribe().wait_for(|&seen| seen > count).await;
}
