//! The in-memory backend, model-checked: small scenarios (2–3 tasks, one name) run under every
//! order in which their tasks can be polled, and every task dropped (cancelled) at each of its
//! polls, exhaustively (depth-first over the scheduling choices, each path replayed from the
//! start on a fresh runtime and manager). At every grant: no other holder whose lease has not
//! ended (a reader beside readers only, at most `permits` permit holders); fencing tokens
//! strictly increase. At the end of every path: every task that was not cancelled finished,
//! no waiter was stranded (the virtual clock did not run to a waiter's hour-long `wait`), and
//! the name is free and its entry gone.
//!
//! Why a scheduler of our own and not `loom` or `shuttle`: the backend waits on tokio's
//! `Notify`, `oneshot` and timers (lease ends, `hold_at_least`, deadlines), and neither tool
//! drives tokio's timers; here the tasks are polled by hand inside a current-thread tokio runtime
//! whose clock is paused, so timers fire in virtual time and wake the task they belong to, and
//! the scheduler picks among the woken tasks. A task's own waker marks it runnable, so the
//! choices are exactly the interleavings the backend can see (as shuttle's DFS scheduler does).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use lock_runtime::{LockGuard, LockManager};
use tokio::time::Instant;

/// Depth-first choices: the path taken so far, replayed from the start on every run.
#[derive(Default)]
struct Chooser {
    /// `(chosen, options)` at each choice of the current path.
    path: Vec<(usize, usize)>,
    pos: usize,
}

impl Chooser {
    fn choose(&mut self, options: usize) -> usize {
        assert!(options > 0);
        if self.pos < self.path.len() {
            let (chosen, n) = self.path[self.pos];
            assert_eq!(n, options, "a replayed path made other choices: the scenario is not deterministic");
            self.pos += 1;
            return chosen;
        }
        self.path.push((0, options));
        self.pos += 1;
        0
    }

    /// The next path, depth first; `false` when every path was taken.
    fn advance(&mut self) -> bool {
        self.pos = 0;
        while let Some((chosen, n)) = self.path.pop() {
            if chosen + 1 < n {
                self.path.push((chosen + 1, n));
                return true;
            }
        }
        false
    }
}

/// A task's waker: marks it runnable.
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// What the holders look like, as the tasks report them.
#[derive(Default)]
struct Model {
    /// `(task, mode, token, lease end)` of every holding believed live.
    holding: Vec<(usize, Mode, u64, Option<Instant>)>,
    /// Every token reported so far.
    tokens: std::collections::BTreeSet<u64>,
    grants: usize,
}

impl Model {
    /// The highest token reported so far (taken as a request begins).
    fn highest(&self) -> u64 {
        self.tokens.last().copied().unwrap_or(0)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Exclusive,
    Read,
    Permit(u32),
}

type Shared = Arc<Mutex<Model>>;

/// The highest token reported before a request begins: its grant's token must be above it.
fn before_request(model: &Shared) -> u64 {
    model.lock().unwrap().highest()
}

/// Records a grant and checks it against the live holdings and the tokens reported before its
/// request began (`floor`; grants handed out together, to readers, may be reported in any
/// order, so only those count).
fn granted(model: &Shared, task: usize, mode: Mode, guard: &LockGuard, lease: Option<Duration>, floor: u64) {
    let now = Instant::now();
    let mut m = model.lock().unwrap();
    // Holdings whose fixed lease ended are over (their `lost()` fired at the end).
    m.holding.retain(|(_, _, _, until)| until.is_none_or(|u| now < u));
    let others: Vec<Mode> = m.holding.iter().map(|h| h.1).collect();
    let ok = match mode {
        Mode::Exclusive => others.is_empty(),
        Mode::Read => others.iter().all(|o| *o == Mode::Read),
        Mode::Permit(n) => others.iter().all(|o| *o == mode) && others.len() < n as usize,
    };
    assert!(ok, "task {task} granted {mode:?} beside {others:?}");
    let token = guard.fencing_token();
    assert!(token > floor, "task {task}: token {token} not above {floor}, reported before its request");
    assert!(m.tokens.insert(token), "task {task}: token {token} handed out twice");
    m.holding.push((task, mode, token, lease.map(|l| now + l)));
    m.grants += 1;
}

/// Forgets `task`'s holding (before its release begins, or as it is cancelled).
fn released(model: &Shared, task: usize) {
    model.lock().unwrap().holding.retain(|h| h.0 != task);
}

type Task = Pin<Box<dyn Future<Output = ()>>>;

/// A scenario: its tasks, given the manager, the model and each task's index.
type Scenario = fn(&LockManager, &Shared) -> Vec<Task>;

/// The longest a path may run in virtual time: far past every lease and hold in the
/// scenarios, far short of the waiters' hour.
const STRANDED: Duration = Duration::from_secs(60);

/// Runs one path of `scenario`, making its choices with `chooser`; `cancels` tasks may be
/// dropped. Panics on a broken rule.
fn run_path(scenario: Scenario, chooser: &mut Chooser, cancels: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    runtime.block_on(async {
        let manager = LockManager::memory();
        let model = Shared::default();
        let mut tasks: Vec<Option<Task>> = scenario(&manager, &model).into_iter().map(Some).collect();
        let flags: Vec<Arc<Flag>> = tasks.iter().map(|_| Arc::new(Flag(AtomicBool::new(true)))).collect();
        let mut cancelled = vec![false; tasks.len()];
        let mut cancels_left = cancels;
        let started = Instant::now();
        loop {
            let live: Vec<usize> = (0..tasks.len()).filter(|&i| tasks[i].is_some()).collect();
            if live.is_empty() {
                break;
            }
            let ready: Vec<usize> = live.iter().copied().filter(|&i| flags[i].0.load(Ordering::SeqCst)).collect();
            if ready.is_empty() {
                // Everyone waits: let virtual time pass to the next timer (and spawned tasks run).
                assert!(Instant::now() - started < STRANDED, "stranded: tasks {live:?} never woken");
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
            // Poll a ready task, or (while the budget lasts) drop any live one.
            let options = ready.len() + if cancels_left > 0 { live.len() } else { 0 };
            let choice = chooser.choose(options);
            if choice >= ready.len() {
                let i = live[choice - ready.len()];
                tasks[i] = None; // cancelled at this point: its guard (if any) is dropped
                released(&model, i);
                cancelled[i] = true;
                cancels_left -= 1;
            } else {
                let i = ready[choice];
                flags[i].0.store(false, Ordering::SeqCst);
                let waker = Waker::from(flags[i].clone());
                let mut cx = Context::from_waker(&waker);
                if tasks[i].as_mut().unwrap().as_mut().poll(&mut cx).is_ready() {
                    tasks[i] = None;
                }
            }
            // Tasks the backend spawned (a release's rest, a lease's end) run between steps.
            tokio::task::yield_now().await;
        }
        // Background clean-up (a dropped guard's or waiter's) finishes; then nothing is left.
        tokio::time::sleep(STRANDED).await;
        let info = manager.inspect("m").await.expect("inspect");
        assert!(info.is_none(), "the name is still held or waited on after every task ended: {info:?}");
        let guard = manager.try_lock("m").await.expect("try_lock").expect("the name is free");
        guard.release().await.expect("release");
        let grants = model.lock().unwrap().grants;
        assert!(grants > 0 || cancelled.iter().any(|c| *c), "nothing was granted and nothing cancelled");
    });
}

/// Every path of `scenario` with up to `cancels` cancellations; the number of paths.
fn explore(scenario: Scenario, cancels: usize) -> usize {
    let mut chooser = Chooser::default();
    let mut paths = 0;
    loop {
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_path(scenario, &mut chooser, cancels)));
        paths += 1;
        if let Err(panic) = outcome {
            let choices: Vec<usize> = chooser.path.iter().map(|c| c.0).collect();
            eprintln!("path {paths} failed; its choices: {choices:?}");
            std::panic::resume_unwind(panic);
        }
        if !chooser.advance() {
            return paths;
        }
    }
}

const HOUR: Duration = Duration::from_secs(3600);

/// A task that locks `m` in `mode`, holds it across one scheduling point, and releases.
fn holder(m: &LockManager, model: &Shared, task: usize, mode: Mode, lease: Option<Duration>) -> Task {
    rounds(m, model, task, mode, lease, 1)
}

/// [`holder`], `n` times over.
fn rounds(m: &LockManager, model: &Shared, task: usize, mode: Mode, lease: Option<Duration>, n: usize) -> Task {
    let (m, model) = (m.clone(), model.clone());
    Box::pin(async move {
        for _ in 0..n {
            one_round(&m, &model, task, mode, lease).await;
        }
    })
}

async fn one_round(m: &LockManager, model: &Shared, task: usize, mode: Mode, lease: Option<Duration>) {
    {
        let floor = before_request(model);
        let request = match mode {
            Mode::Exclusive => m.lock("m"),
            Mode::Read => m.read_lock("m"),
            Mode::Permit(n) => m.semaphore("m", n),
        };
        let request = request.wait(HOUR);
        let request = match lease {
            Some(lease) => request.lease(lease),
            None => request,
        };
        let guard = request.into_future().await.expect("granted within the hour");
        granted(model, task, mode, &guard, lease, floor);
        tokio::task::yield_now().await;
        released(model, task);
        let outcome = guard.release().await;
        assert!(outcome.is_ok() || lease.is_some(), "task {task}: release failed: {outcome:?}");
    }
}

#[test]
fn two_mutex_holders_under_every_order_and_cancellation() {
    let scenario: Scenario =
        |m, model| vec![holder(m, model, 0, Mode::Exclusive, None), holder(m, model, 1, Mode::Exclusive, None)];
    let paths = explore(scenario, 1);
    eprintln!("two mutex holders: {paths} paths");
    assert!(paths > 10, "{paths} paths: the scheduler explored nothing");
}

#[test]
fn three_mutex_holders_under_every_order() {
    let scenario: Scenario = |m, model| (0..3).map(|i| holder(m, model, i, Mode::Exclusive, None)).collect();
    eprintln!("three mutex holders: {} paths", explore(scenario, 0));
}

#[test]
fn two_mutex_holders_twice_each_with_two_cancelled_anywhere() {
    let scenario: Scenario = |m, model| (0..2).map(|i| rounds(m, model, i, Mode::Exclusive, None, 2)).collect();
    eprintln!("two mutex holders, twice each, two cancelled: {} paths", explore(scenario, 2));
}

/// The model itself: two stores that know nothing of each other grant the same name twice
/// (token 1 twice on the first path, both at once on others), and the check says so (the rules
/// can fail).
#[test]
#[should_panic(expected = "task 1")]
fn the_model_catches_two_holders() {
    let scenario: Scenario = |m, model| {
        let elsewhere = LockManager::memory();
        let second = holder(&elsewhere, model, 1, Mode::Exclusive, None);
        vec![holder(m, model, 0, Mode::Exclusive, None), second]
    };
    explore(scenario, 0);
}

#[test]
fn three_mutex_holders_with_one_cancelled_anywhere() {
    let scenario: Scenario = |m, model| (0..3).map(|i| holder(m, model, i, Mode::Exclusive, None)).collect();
    eprintln!("three mutex holders, one cancelled: {} paths", explore(scenario, 1));
}

/// A holder whose fixed lease ends while it holds across a long pause: the waiter is granted at
/// the lease's end (not at the release), the holder's release then fails as lost.
#[test]
fn a_fixed_lease_ends_under_every_order_and_cancellation() {
    let scenario: Scenario = |m, model| {
        let (m0, model0) = (m.clone(), model.clone());
        let sleeper: Task = Box::pin(async move {
            let lease = Duration::from_millis(10);
            let floor = before_request(&model0);
            let guard = m0.lock("m").wait(HOUR).lease(lease).await.expect("granted");
            granted(&model0, 0, Mode::Exclusive, &guard, Some(lease), floor);
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(guard.is_lost(), "lost() fired at the lease's end");
            released(&model0, 0);
            assert!(guard.release().await.unwrap_err().is_lost());
        });
        vec![sleeper, holder(m, model, 1, Mode::Exclusive, None)]
    };
    eprintln!("a fixed lease's end: {} paths", explore(scenario, 1));
}

#[test]
fn readers_and_a_writer_under_every_order_and_cancellation() {
    let scenario: Scenario = |m, model| {
        let (mw, modelw) = (m.clone(), model.clone());
        let writer: Task = Box::pin(async move {
            let floor = before_request(&modelw);
            let guard = mw.write_lock("m").wait(HOUR).await.expect("granted");
            granted(&modelw, 2, Mode::Exclusive, &guard, None, floor);
            tokio::task::yield_now().await;
            released(&modelw, 2);
            guard.release().await.expect("release");
        });
        vec![holder(m, model, 0, Mode::Read, None), holder(m, model, 1, Mode::Read, None), writer]
    };
    eprintln!("two readers and a writer: {} paths", explore(scenario, 1));
}

#[test]
fn three_permit_holders_of_two_under_every_order_and_cancellation() {
    let scenario: Scenario = |m, model| (0..3).map(|i| rounds(m, model, i, Mode::Permit(2), None, 2)).collect();
    eprintln!("three holders of a two-permit semaphore: {} paths", explore(scenario, 1));
}

/// A release with `hold_at_least` time left keeps the name until then; a waiter is granted at
/// that point, under every order.
#[test]
fn hold_at_least_under_every_order_and_cancellation() {
    let scenario: Scenario = |m, model| {
        let (m0, model0) = (m.clone(), model.clone());
        let early: Task = Box::pin(async move {
            let floor = before_request(&model0);
            let guard = m0.lock("m").wait(HOUR).hold_at_least(Duration::from_millis(10)).await.expect("granted");
            // Held in the model until the 10 ms are over: nobody may be granted before.
            granted(&model0, 0, Mode::Exclusive, &guard, Some(Duration::from_millis(10)), floor);
            guard.release().await.expect("release");
        });
        vec![early, holder(m, model, 1, Mode::Exclusive, None)]
    };
    eprintln!("hold_at_least: {} paths", explore(scenario, 1));
}
