//! Real network partitions: a private network a test makes for itself, each server member and
//! each client in a network namespace of its own with an address of its own, so that a rule
//! cuts exactly the link a nemesis names (a member from a member, a client from a member, one
//! direction only), as a partition does: the packets are dropped, nobody is told.
//!
//! The layout: a bridge `lkt<N>b` in the test's own namespace (the test process, which starts
//! the servers and reads their state, is `10.77.<N>.1` on it and is never cut), and one veth pair
//! per end: member `i` is `10.77.<N>.(10+i)` in namespace `lkt<N>m<i>`, client `k` is
//! `10.77.<N>.(100+k)` in `lkt<N>c<k>`. A cut is an `iptables` rule in the receiving end's
//! namespace that drops what the sending end sends (`INPUT -s <from> -j DROP`); a rule in a
//! namespace goes with it. A client is a thread that entered its namespace and runs a tokio
//! runtime of its own ([`Client::spawn`]): every socket a manager on it opens, now or when it
//! reconnects, is the client's.
//!
//! `<N>` (1 to 250) is claimed by a file in `/tmp/lock-tests-net/` holding the test process's
//! pid. Dropping the [`Net`] removes its namespaces, its bridge and its claim; a run that
//! crashed leaves them behind, and the next [`Net::new`] of any suite removes every namespace
//! and bridge named `lkt<N>…` whose claim is missing or whose process is gone. The server
//! processes a fixture started in a namespace are killed by their [`ServerProcess`] reaper
//! when the test process dies.
//!
//! Needs root (CI and this machine run as root), `ip` (iproute2), `iptables` and `nsenter`.
//!
//! [`ServerProcess`]: crate::server_process::ServerProcess

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// One end of a link: a server member or a client, by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Server member `i`.
    Member(usize),
    /// Client `k`.
    Client(usize),
}

/// A private network of `members` server members and `clients` clients, removed on drop.
#[derive(Debug)]
pub struct Net {
    n: u16,
    members: usize,
    clients: usize,
    claim: PathBuf,
    /// The rules in force: (namespace, source address).
    cuts: Mutex<Vec<(String, Ipv4Addr)>>,
}

const CLAIMS: &str = "/tmp/lock-tests-net";

impl Net {
    /// Makes the network: the bridge, and a namespace with its address for every member and
    /// client. Removes what crashed runs left first. Panics (failing the test) if the
    /// namespaces cannot be made (not root, no `ip`).
    pub fn new(members: usize, clients: usize) -> Net {
        assert!(members <= 80 && clients <= 100, "at most 80 members and 100 clients");
        std::fs::create_dir_all(CLAIMS).expect("create the claims directory");
        remove_leftovers();
        let n = claim();
        let net =
            Net { n, members, clients, claim: Path::new(CLAIMS).join(n.to_string()), cuts: Mutex::new(Vec::new()) };
        remove_prefix(&net.prefix());
        let bridge = net.bridge();
        ip(&["link", "add", &bridge, "type", "bridge"]);
        ip(&["addr", "add", &format!("{}/24", net.root_addr()), "dev", &bridge]);
        ip(&["link", "set", &bridge, "up"]);
        let ends = (0..members).map(End::Member).chain((0..clients).map(End::Client));
        for end in ends {
            let (ns, veth) = (net.namespace(end), net.veth(end));
            ip(&["netns", "add", &ns]);
            let inside = format!("{veth}i");
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", &inside, "netns", &ns]);
            ip(&["link", "set", &veth, "master", &bridge, "up"]);
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", net.addr(end)), "dev", &inside]);
            ip(&["-n", &ns, "link", "set", &inside, "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        net
    }

    /// How many members.
    pub fn members(&self) -> usize {
        self.members
    }

    /// The address of an end.
    pub fn addr(&self, end: End) -> Ipv4Addr {
        let host = match end {
            End::Member(i) => 10 + i,
            End::Client(k) => 100 + k,
        };
        Ipv4Addr::new(10, 77, self.n as u8, host as u8)
    }

    /// The test process's own address on the bridge (never cut).
    pub fn root_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, self.n as u8, 1)
    }

    /// A command that runs `program` in the namespace of `end` (a server member, or a client
    /// process); `nsenter` execs it: its pid is the program's, so kill and SIGSTOP reach it.
    pub fn command(&self, end: End, program: &str) -> Command {
        let mut command = Command::new("nsenter");
        command.arg(format!("--net=/var/run/netns/{}", self.namespace(end))).arg(program);
        command
    }

    /// Drops every packet `from` sends to `to` (one direction only).
    pub fn cut_one_way(&self, from: End, to: End) {
        let (ns, source) = (self.namespace(to), self.addr(from));
        iptables(&ns, &["-A", "INPUT", "-s", &source.to_string(), "-j", "DROP"]);
        lock(&self.cuts).push((ns, source));
    }

    /// Cuts the link between `a` and `b`, both directions.
    pub fn cut(&self, a: End, b: End) {
        self.cut_one_way(a, b);
        self.cut_one_way(b, a);
    }

    /// Cuts every link between a member of `side` and a member or client not in it.
    pub fn split(&self, side: &[End]) {
        let all: Vec<End> = (0..self.members).map(End::Member).chain((0..self.clients).map(End::Client)).collect();
        for &a in side {
            for &b in all.iter().filter(|b| !side.contains(b)) {
                self.cut(a, b);
            }
        }
    }

    /// Removes every cut.
    pub fn heal(&self) {
        for (ns, source) in std::mem::take(&mut *lock(&self.cuts)) {
            iptables(&ns, &["-D", "INPUT", "-s", &source.to_string(), "-j", "DROP"]);
        }
    }

    /// A client in client `k`'s namespace: a thread of its own running a tokio runtime.
    pub fn client(&self, k: usize) -> Client {
        assert!(k < self.clients, "client {k} of {}", self.clients);
        Client::enter(Some(format!("/var/run/netns/{}", self.namespace(End::Client(k)))))
    }

    fn prefix(&self) -> String {
        format!("lkt{}", self.n)
    }

    fn bridge(&self) -> String {
        format!("{}b", self.prefix())
    }

    fn tag(end: End) -> String {
        match end {
            End::Member(i) => format!("m{i}"),
            End::Client(k) => format!("c{k}"),
        }
    }

    fn namespace(&self, end: End) -> String {
        format!("{}{}", self.prefix(), Self::tag(end))
    }

    fn veth(&self, end: End) -> String {
        format!("{}-{}", self.prefix(), Self::tag(end))
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        remove_prefix(&self.prefix());
        let _ = std::fs::remove_file(&self.claim);
    }
}

/// A client in a namespace of its own: a thread that entered it and runs a current-thread
/// tokio runtime; the futures it is given run there, with every socket they open (a manager's
/// connections, its reconnections) in the client's namespace. Dropping it stops the runtime.
#[derive(Debug)]
pub struct Client {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Client {
    /// A client in the test's own namespace (for ensembles on loopback).
    pub fn local() -> Client {
        Client::enter(None)
    }

    fn enter(namespace: Option<String>) -> Client {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            if let Some(namespace) = namespace {
                let file = std::fs::File::open(&namespace).unwrap_or_else(|e| panic!("open {namespace}: {e}"));
                // setns(2): this thread only.
                rustix::thread::move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&file),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .unwrap_or_else(|e| panic!("setns {namespace}: {e}"));
            }
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("client runtime");
            handle_tx.send(runtime.handle().clone()).expect("send the client's handle");
            runtime.block_on(async {
                let _ = stopped.await;
            });
        });
        let handle = handle_rx.recv().expect("the client thread started");
        Client { handle, stop: Some(stop), thread: Some(thread) }
    }

    /// Runs `future` on the client (in its namespace); await the handle for its output.
    pub fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(future)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Claims a free network number: a claim file made with `create_new`, holding this pid.
fn claim() -> u16 {
    let pid = std::process::id();
    for n in 1..=250u16 {
        let path = Path::new(CLAIMS).join(n.to_string());
        if std::fs::OpenOptions::new().write(true).create_new(true).open(&path).is_ok() {
            std::fs::write(&path, pid.to_string()).expect("write the claim");
            return n;
        }
    }
    panic!("no free network number in {CLAIMS} (250 claimed)");
}

/// Whether claim `n` is held by a live process (a claim being written counts as held).
fn claimed(n: &str) -> bool {
    match std::fs::read_to_string(Path::new(CLAIMS).join(n)) {
        Ok(pid) if pid.trim().is_empty() => true,
        Ok(pid) => Path::new("/proc").join(pid.trim()).exists(),
        Err(_) => false,
    }
}

/// Removes the namespaces and bridges of every claim whose process is gone (or whose claim
/// file is), and those claims.
fn remove_leftovers() {
    let mut stale: Vec<String> = Vec::new();
    let names = String::from_utf8_lossy(&output("ip", &["netns", "list"])).into_owned()
        + &String::from_utf8_lossy(&output("ip", &["-o", "link", "show"]));
    for word in names.split_whitespace() {
        let Some(rest) = word.trim_end_matches(':').strip_prefix("lkt") else { continue };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if !digits.is_empty() && !claimed(&digits) && !stale.contains(&digits) {
            stale.push(digits);
        }
    }
    for entry in std::fs::read_dir(CLAIMS).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !claimed(&name) && !stale.contains(&name) {
            stale.push(name);
        }
    }
    for n in stale {
        remove_prefix(&format!("lkt{n}"));
        let _ = std::fs::remove_file(Path::new(CLAIMS).join(n));
    }
}

/// Removes every veth named `<prefix>-…` (both ends: at once, where a namespace's removal
/// takes its interfaces away only later), every namespace named `<prefix>m…`/`<prefix>c…`
/// (its rules go with it) and the bridge `<prefix>b`.
fn remove_prefix(prefix: &str) {
    let links = String::from_utf8_lossy(&output("ip", &["-o", "link", "show"])).into_owned();
    let veth = format!("{prefix}-");
    for link in links.lines().filter_map(|l| l.split_whitespace().nth(1)) {
        let name = link.trim_end_matches(':').split('@').next().unwrap_or_default();
        if name.starts_with(&veth) {
            let _ = Command::new("ip").args(["link", "del", name]).stderr(std::process::Stdio::null()).status();
        }
    }
    let list = String::from_utf8_lossy(&output("ip", &["netns", "list"])).into_owned();
    for ns in list.lines().filter_map(|l| l.split_whitespace().next()) {
        if let Some(rest) = ns.strip_prefix(prefix) {
            if rest.starts_with('m') || rest.starts_with('c') {
                let _ = Command::new("ip").args(["netns", "del", ns]).status();
            }
        }
    }
    let _ =
        Command::new("ip").args(["link", "del", &format!("{prefix}b")]).stderr(std::process::Stdio::null()).status();
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn output(program: &str, args: &[&str]) -> Vec<u8> {
    Command::new(program).args(args).output().map(|o| o.stdout).unwrap_or_default()
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run `ip` (iproute2; scripts/test installs it)");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

fn iptables(namespace: &str, args: &[&str]) {
    let out = Command::new("ip")
        .args(["netns", "exec", namespace, "iptables", "-w"])
        .args(args)
        .output()
        .expect("run `iptables` (scripts/test installs it)");
    assert!(
        out.status.success(),
        "iptables {} in {namespace}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}
