//! A private 3-node (or n-node) nats-server cluster with JetStream on
//! loopback: each node on free client and route ports, with a temporary
//! store of its own, `sync_interval: always` (every write flushed before
//! it is acknowledged), routes to every other node. Nodes are killed
//! (SIGKILL) and started again on the same ports and stores; all are
//! killed on drop.

use crate::nats::{free_port, nats_server_bin};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One node of a [`NatsCluster`].
struct Node {
    name: String,
    port: u16,
    config: std::path::PathBuf,
    log: std::path::PathBuf,
    child: Option<Child>,
}

/// A running cluster.
pub struct NatsCluster {
    nodes: Vec<Node>,
    dir: tempfile::TempDir,
}

impl NatsCluster {
    /// Starts `n` nodes (`n1` …) and waits until JetStream answers on the
    /// first (its meta leader elected), 60 s at most.
    ///
    /// # Panics
    /// A node does not start, or JetStream does not answer in time.
    pub async fn start(n: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let mut nodes = Vec::new();
        for (i, (port, route)) in ports.iter().enumerate() {
            let name = format!("n{}", i + 1);
            let store = dir.path().join(&name);
            std::fs::create_dir_all(&store).unwrap();
            let routes: Vec<String> = ports
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, (_, r))| format!("\"nats-route://127.0.0.1:{r}\""))
                .collect();
            let config = dir.path().join(format!("{name}.conf"));
            std::fs::write(
                &config,
                format!(
                    "server_name: {name}\nlisten: \"127.0.0.1:{port}\"\n\
                     jetstream {{ store_dir: \"{}\", sync_interval: always }}\n\
                     cluster {{ name: idem-test, listen: \"127.0.0.1:{route}\", routes: [{}] }}\n",
                    store.display(),
                    routes.join(", ")
                ),
            )
            .unwrap();
            nodes.push(Node {
                log: dir.path().join(format!("{name}.log")),
                name,
                port: *port,
                config,
                child: None,
            });
        }
        let mut cluster = NatsCluster { nodes, dir };
        for i in 0..n {
            cluster.spawn(i);
        }
        cluster.wait_for_jetstream().await;
        cluster
    }

    fn spawn(&mut self, i: usize) {
        use std::io::Read as _;
        let node = &mut self.nodes[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .unwrap();
        let mut child = Command::new(nats_server_bin())
            .arg("-c")
            .arg(&node.config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start nats-server ({e}); run `bash scripts/setup.sh`")
            });
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(
                child.try_wait().unwrap().is_none(),
                "nats-server {} exited at start (port taken?); its log: {}",
                node.name,
                std::fs::read_to_string(&node.log).unwrap_or_default()
            );
            if let Ok(mut probe) = std::net::TcpStream::connect(("127.0.0.1", node.port)) {
                let _ = probe.set_read_timeout(Some(Duration::from_secs(2)));
                let mut greeting = [0u8; 5];
                if probe.read_exact(&mut greeting).is_ok() && &greeting == b"INFO " {
                    node.child = Some(child);
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "nats-server {} did not listen",
                node.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until JetStream answers an account info request on every
    /// running node (60 s at most).
    ///
    /// # Panics
    /// When it does not.
    pub async fn wait_for_jetstream(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            let url = format!("nats://127.0.0.1:{}", node.port);
            loop {
                let ok = match async_nats::connect(&url).await {
                    Ok(c) => async_nats::jetstream::new(c).query_account().await.is_ok(),
                    Err(_) => false,
                };
                if ok {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "JetStream did not answer on {}",
                    node.name
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    /// Every node's URL, comma-separated, as `[broker] url` takes them.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A JetStream context on a connection that knows every node.
    ///
    /// # Panics
    /// When no node accepts the connection.
    pub async fn jetstream(&self) -> async_nats::jetstream::Context {
        let urls: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect();
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(urls.as_slice())
            .await
            .unwrap();
        async_nats::jetstream::new(client)
    }

    /// The index of the node named `name` (`n1` is 0).
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Kills node `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the killed node `i` again, same ports and store.
    ///
    /// # Panics
    /// When it is running, or does not listen within 10 s.
    pub fn start_again(&mut self, i: usize) {
        assert!(self.nodes[i].child.is_none(), "node {i} is running");
        self.spawn(i);
    }

    /// The logs of every node, for a failing test's message.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                format!(
                    "--- {} ---\n{}",
                    n.name,
                    std::fs::read_to_string(&n.log).unwrap_or_default()
                )
            })
            .collect()
    }

    /// The directory holding every node's config, store and log.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}
