//! Conformance cases of the lock kinds: multi-name locks (every backend), read-write locks and
//! semaphores (the backends that [`support`](crate::LockManager::supports) them; the cases
//! return at once, passing, on the others).

use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{builder, manager, poll_then_drop, Factory};
use crate::backend::LockKind;
use crate::LockManager;

/// Whether the backend offers `kind`; the case is skipped (with a note) when not.
fn offers(m: &LockManager, kind: LockKind) -> bool {
    let offered = m.supports(kind);
    if !offered {
        eprintln!("skipped: the {} backend does not support a {kind}", m.backend_name());
    }
    offered
}

/// `lock_all` holds every name (given in any order, repeated or not) until released; when one
/// is held elsewhere past `wait`, it fails contended and holds none of them afterwards.
pub async fn lock_all_takes_every_name_or_none(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    let all = m.lock_all(["b", "a", "b"]).await.expect("free names");
    assert_eq!(all.keys().collect::<Vec<_>>(), ["a", "b"], "sorted, each once");
    assert_eq!(all.fencing_tokens().len(), 2);
    assert!(m.try_lock("a").await.expect("try").is_none(), "a held by lock_all");
    assert!(m.try_lock("b").await.expect("try").is_none(), "b held by lock_all");
    all.release().await.expect("release");
    assert!(m.try_lock("a").await.expect("try").is_some(), "a released");

    // `c` sorts last: `a` is taken first, then must be given back.
    let blocker = m.lock("c").await.expect("blocker");
    let started = Instant::now();
    let err = m.lock_all(["c", "a"]).wait(Duration::from_millis(300)).await.expect_err("c is held");
    assert!(err.is_contended(), "{err}");
    assert!(err.to_string().contains("`c`"), "names the busy lock: {err}");
    assert!(started.elapsed() < Duration::from_secs(3), "gave up late: {:?}", started.elapsed());
    let a = m.lock("a").wait(Duration::from_secs(5)).await.expect("a rolled back");
    assert!(started.elapsed() < Duration::from_secs(3), "a was released late");
    a.release().await.expect("release");
    assert!(m.try_lock_all(["a", "c"]).await.expect("try").is_none(), "c still held");
    blocker.release().await.expect("release");
    let both = m.try_lock_all(["a", "c"]).await.expect("try").expect("both free");
    both.release().await.expect("release");
    assert!(m.lock_all(Vec::<String>::new()).await.expect_err("no names").is_invalid());
    assert!(m.lock_all(["ok", ""]).await.expect_err("an empty name").is_invalid());
    assert!(m.try_lock("ok").await.expect("try").is_some(), "nothing taken on bad input");
}

/// 16 tasks take `["a", "b"]` and `["b", "a"]` (half each) over and over: nobody deadlocks,
/// and no two ever hold a name at once.
pub async fn lock_all_in_both_orders_never_deadlocks_nor_overlaps(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    let inside = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let mut tasks = Vec::new();
    for t in 0..16 {
        let (m, inside) = (m.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let names = if t % 2 == 0 { ["a", "b"] } else { ["b", "a"] };
            for _ in 0..5 {
                let all = m.lock_all(names).wait(Duration::from_secs(60)).await.expect("lock_all");
                for slot in inside.iter() {
                    assert_eq!(slot.fetch_add(1, Ordering::SeqCst), 0, "two holders of one name at once");
                }
                tokio::task::yield_now().await;
                for slot in inside.iter() {
                    slot.fetch_sub(1, Ordering::SeqCst);
                }
                all.release().await.expect("release");
            }
        }));
    }
    let all = async {
        for t in tasks {
            t.await.expect("task");
        }
    };
    tokio::time::timeout(Duration::from_secs(120), all).await.expect("deadlocked");
}

/// A `lock_all` dropped after any of its polls (one name taken, waiting for the next) holds
/// nothing afterwards: the names it took are free at once.
pub async fn lock_all_cancelled_after_any_poll_rolls_back(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    let blocker = m.lock("z").await.expect("blocker");
    for polls in 1..=64 {
        let all = m.lock_all(["a", "z"]).wait(Duration::from_secs(20)).into_future();
        let (got, parked) = poll_then_drop(all, polls).await;
        assert!(got.is_none(), "lock_all got a held name (poll {polls})");
        let started = Instant::now();
        let a =
            m.lock("a").wait(Duration::from_secs(10)).await.unwrap_or_else(|e| {
                panic!("after dropping lock_all at poll {polls}, the name it took stayed taken: {e}")
            });
        assert!(started.elapsed() < Duration::from_secs(2), "a was released after {:?}", started.elapsed());
        a.release().await.expect("release");
        if parked {
            break; // it reached its wait for `z`: every await point before it was cut once
        }
        assert!(polls < 64, "lock_all was still being polled after 64 polls without parking");
    }
    blocker.release().await.expect("release");
    m.lock_all(["a", "z"]).wait(Duration::from_secs(5)).await.expect("both free").release().await.expect("release");
}

/// A `lock_all` guard is lost when one of its locks is (here: fixed leases running out), and
/// its release says so.
pub async fn lock_all_is_lost_if_one_is_lost(make: &impl Factory) {
    let m = manager(make).await;
    let all = m.lock_all(["x", "y"]).lease(Duration::from_millis(300)).await.expect("free");
    assert!(!all.is_lost());
    tokio::time::timeout(Duration::from_secs(5), all.lost()).await.expect("lost() fired");
    assert!(all.is_lost());
    assert!(all.release().await.expect_err("lost").is_lost());
}

/// A backend refuses the kinds it does not offer at once, with an `is_invalid()` error naming
/// the backend and the kind (never a hang, never a silent mutex).
pub async fn unsupported_kinds_are_refused_at_once(make: &impl Factory) {
    let m = manager(make).await;
    let kinds = [LockKind::Read, LockKind::Write, LockKind::Semaphore { permits: 2 }];
    for kind in kinds {
        if m.supports(kind) {
            continue;
        }
        let started = Instant::now();
        let request = match kind {
            LockKind::Read => m.read_lock("refused"),
            LockKind::Write => m.write_lock("refused"),
            _ => m.semaphore("refused", 2),
        };
        let err = request.wait(Duration::from_secs(30)).await.expect_err("refused");
        assert!(err.is_invalid(), "{err}");
        let text = err.to_string();
        assert!(text.contains(m.backend_name()) && text.contains(&kind.to_string()), "{text}");
        assert!(started.elapsed() < Duration::from_secs(1), "refused after {:?}", started.elapsed());
    }
}

/// A read-write lock, a semaphore and a mutex of one name never exclude each other.
pub async fn kinds_have_their_own_namespace(make: &impl Factory) {
    let m = manager(make).await;
    if !offers(&m, LockKind::Write) || !offers(&m, LockKind::Semaphore { permits: 1 }) {
        return;
    }
    let writer = m.write_lock("shared").await.expect("writer");
    let mutex = m.try_lock("shared").await.expect("try").expect("the mutex is another lock");
    let permit = m.try_semaphore("shared", 1).await.expect("try").expect("the semaphore is another lock");
    assert!(m.try_read_lock("shared").await.expect("try").is_none(), "read and write share one lock");
    for released in [writer.release().await, mutex.release().await, permit.release().await] {
        released.expect("release");
    }
}

/// Readers hold one name at once.
pub async fn readers_overlap(make: &impl Factory) {
    let m = manager(make).await;
    if !offers(&m, LockKind::Read) {
        return;
    }
    let first = m.read_lock("books").await.expect("first reader");
    let second = m.read_lock("books").wait(Duration::ZERO).await.expect("a second reader at once");
    let third = m.try_read_lock("books").await.expect("try").expect("a third reader at once");
    assert!(second.fencing_token() != first.fencing_token() && third.fencing_token() != second.fencing_token());
    for g in [first, second, third] {
        g.release().await.expect("release");
    }
}

/// A writer excludes readers and writers; readers exclude writers; a released writer lets
/// them in.
pub async fn writer_excludes_everyone(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    if !offers(&m, LockKind::Write) {
        return;
    }
    let writer = m.write_lock("ledger").await.expect("writer");
    assert!(m.try_read_lock("ledger").await.expect("try").is_none(), "a reader beside a writer");
    assert!(m.try_write_lock("ledger").await.expect("try").is_none(), "two writers");
    let err = m.read_lock("ledger").wait(Duration::from_millis(200)).await.expect_err("held");
    assert!(err.is_contended(), "{err}");
    let m2 = m.clone();
    let reader = tokio::spawn(async move { m2.read_lock("ledger").wait(Duration::from_secs(10)).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let released_at = Instant::now();
    writer.release().await.expect("release");
    let reader = reader.await.expect("task").expect("reader after the writer");
    assert!(released_at.elapsed() < Duration::from_secs(2), "hand-off took {:?}", released_at.elapsed());
    assert!(m.try_write_lock("ledger").await.expect("try").is_none(), "a writer beside a reader");
    reader.release().await.expect("release");
    m.try_write_lock("ledger").await.expect("try").expect("free").release().await.expect("release");
}

/// Under a steady read load (overlapping readers, so the lock is never free of readers), a
/// writer still gets in: a waiting writer blocks new readers.
pub async fn no_writer_starvation_under_read_load(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    if !offers(&m, LockKind::Write) {
        return;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let mut readers = Vec::new();
    for i in 0..8u64 {
        let (m, stop, reads) = (m.clone(), stop.clone(), reads.clone());
        readers.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5 * i)).await; // staggered: always overlapping
            while !stop.load(Ordering::SeqCst) {
                let g = m.read_lock("hot").wait(Duration::from_secs(30)).await.expect("reader");
                reads.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(40)).await;
                g.release().await.expect("release");
            }
        }));
    }
    while reads.load(Ordering::SeqCst) < 16 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    let writer = m.write_lock("hot").wait(Duration::from_secs(10)).await.expect("the writer starved");
    let waited = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    assert!(waited < Duration::from_secs(3), "the writer waited {waited:?} under the read load");
    writer.release().await.expect("release");
    for r in readers {
        r.await.expect("reader task");
    }
}

/// A waiting writer blocks new readers; once it gives up (dropped), readers get in at once.
pub async fn dropped_waiting_writer_lets_readers_in(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    if !offers(&m, LockKind::Write) {
        return;
    }
    let reader = m.read_lock("queue").await.expect("reader");
    let m2 = m.clone();
    let writer = tokio::spawn(async move { m2.write_lock("queue").wait(Duration::from_secs(30)).await });
    let blocked = async {
        loop {
            if m.try_read_lock("queue").await.expect("try").is_none() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), blocked).await.expect("a waiting writer blocks new readers");
    writer.abort();
    let _ = writer.await;
    let started = Instant::now();
    let second = m.read_lock("queue").wait(Duration::from_secs(10)).await.expect("readers get in");
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    second.release().await.expect("release");
    reader.release().await.expect("release");
}

/// A reader's fixed lease runs out: the waiting writer gets in, the reader's `lost()` fires and
/// its release is `is_lost()`.
pub async fn read_lease_expiry_lets_a_writer_in(make: &impl Factory) {
    let m = manager(make).await;
    if !offers(&m, LockKind::Write) {
        return;
    }
    let lease = Duration::from_millis(300);
    let started = Instant::now();
    let reader = m.read_lock("leased").lease(lease).await.expect("reader");
    let writer = m.write_lock("leased").wait(Duration::from_secs(10)).await.expect("writer after the lease");
    assert!(started.elapsed() >= lease - Duration::from_millis(50), "got in early: {:?}", started.elapsed());
    assert!(writer.fencing_token() > reader.fencing_token());
    tokio::time::timeout(Duration::from_secs(5), reader.lost()).await.expect("lost() fired");
    assert!(reader.release().await.expect_err("released after its lease").is_lost());
    writer.release().await.expect("release");
}

/// In one task, a write inside a read of the same name is refused at once as `is_invalid()`
/// (upgrading would deadlock); a read inside a read or a write re-enters.
pub async fn write_inside_read_is_invalid_at_once(make: &impl Factory) {
    let m = make(builder().default_wait(Duration::from_secs(30))).await;
    if !offers(&m, LockKind::Write) {
        return;
    }
    let started = Instant::now();
    let inner = m
        .read_lock("doc")
        .run(async {
            let upgrade = m.write_lock("doc").run(async {}).await.expect_err("write inside read");
            assert!(upgrade.is_invalid(), "{upgrade}");
            let awaited = m.write_lock("doc").await.expect_err("write inside read, awaited");
            assert!(awaited.is_invalid(), "{awaited}");
            let outer = crate::current().expect("inside").fencing_token();
            let nested = m.read_lock("doc").run(async { crate::current().map(|l| l.fencing_token()) }).await;
            assert_eq!(nested.expect("re-entered"), Some(outer), "read inside read re-enters");
            outer
        })
        .await
        .expect("read run");
    assert!(inner > 0);
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    m.write_lock("doc")
        .run(async {
            let nested = m.read_lock("doc").wait(Duration::from_millis(100)).run(async { 7 }).await;
            assert_eq!(nested.expect("read inside write re-enters"), 7);
        })
        .await
        .expect("write run");
    assert!(m.try_write_lock("doc").await.expect("try").is_some(), "released after the runs");
}

/// 32 tasks contend for a semaphore of 4 permits: never more than 4 holders at once (a shared
/// counter proves it), and more than one at times (it is not a mutex).
pub async fn semaphore_admits_at_most_permits(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    const PERMITS: u32 = 4;
    if !offers(&m, LockKind::Semaphore { permits: PERMITS }) {
        return;
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (m, inside, most) = (m.clone(), inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let permit = m.semaphore("pool", PERMITS).wait(Duration::from_secs(60)).await.expect("permit");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                assert!(now <= PERMITS as usize, "{now} holders of {PERMITS} permits");
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                permit.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most > 1 && most <= PERMITS as usize, "at most {most} holders at once");
}

/// Holders and waiters of one semaphore must agree on `permits`: a different number is
/// `is_invalid()` (never more holders than agreed), and so is zero.
pub async fn semaphore_permits_mismatch_is_invalid(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    if !offers(&m, LockKind::Semaphore { permits: 1 }) {
        return;
    }
    let held = m.semaphore("agreed", 1).await.expect("holder");
    let err = m.semaphore("agreed", 2).wait(Duration::from_secs(5)).await.expect_err("disagrees");
    assert!(err.is_invalid(), "{err}");
    assert!(err.to_string().contains("agreed") && err.to_string().contains("permits"), "{err}");
    assert!(m.try_semaphore("agreed", 1).await.expect("try").is_none(), "one permit only");
    assert!(m.semaphore("zero", 0).await.expect_err("zero permits").is_invalid());
    held.release().await.expect("release");
    let two = m.semaphore("agreed", 2).await.expect("agreed anew once free");
    two.release().await.expect("release");
}

/// Where the store can be inspected, every holder of a read-write lock or a semaphore is
/// listed, each with its kind, token and process (the manager's label); `inspect` of the name
/// gives one of them, and nothing is listed once they let go.
pub async fn kinds_are_listed_with_each_holder(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30)).label("lister")).await;
    if !m.can_inspect() {
        return;
    }
    let mut held = Vec::new();
    if offers(&m, LockKind::Read) {
        held.push((m.read_lock("listed-rw").await.expect("reader"), LockKind::Read));
        held.push((m.read_lock("listed-rw").await.expect("second reader"), LockKind::Read));
    }
    if offers(&m, LockKind::Semaphore { permits: 3 }) {
        held.push((m.semaphore("listed-sem", 3).await.expect("permit"), LockKind::Semaphore { permits: 3 }));
    }
    if held.is_empty() {
        return;
    }
    let listed = m.list("listed-").await.expect("list");
    assert_eq!(listed.len(), held.len(), "one record per holder: {listed:?}");
    for (guard, kind) in &held {
        let token = guard.fencing_token();
        let info = listed
            .iter()
            .find(|i| i.fencing_token == Some(token) && i.key.ends_with(guard.key()))
            .unwrap_or_else(|| panic!("the holder of token {token} is not listed: {listed:?}"));
        assert_eq!(info.kind, Some(*kind), "{info:?}");
        assert_eq!(info.holder.as_ref().and_then(|h| h.label()), Some("lister"), "{info:?}");
    }
    let name = held[0].0.key().to_owned();
    let one = m.inspect(&name).await.expect("inspect").expect("a holder of the name");
    assert!(held.iter().any(|(g, _)| g.key() == name && Some(g.fencing_token()) == one.fencing_token), "{one:?}");
    for (guard, _) in held {
        guard.release().await.expect("release");
    }
    let left = m.list("listed-").await.expect("list");
    assert!(left.is_empty(), "listed after every holder let go: {left:?}");
}

/// A permit waiter (every permit taken) dropped after any of its polls leaves nothing behind:
/// when a holder releases, another caller gets the permit at once.
pub async fn semaphore_waiter_cancelled_after_any_poll_leaves_nothing(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    if !offers(&m, LockKind::Semaphore { permits: 2 }) {
        return;
    }
    let kept = m.semaphore("cs", 2).await.expect("first permit");
    let held = m.semaphore("cs", 2).await.expect("second permit");
    let wait = || m.semaphore("cs", 2).wait(Duration::from_secs(20)).into_future();
    dropped_after_any_poll("a permit waiter", held, wait, wait).await;
    kept.release().await.expect("release");
}

/// A read waiter (behind a writer) dropped after any of its polls leaves nothing behind: when
/// the writer releases, a writer gets the lock at once.
pub async fn kind_waiter_cancelled_after_any_poll_leaves_nothing(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    if !offers(&m, LockKind::Write) {
        return;
    }
    let held = m.write_lock("cw").await.expect("writer");
    let reader = || m.read_lock("cw").wait(Duration::from_secs(20)).into_future();
    let writer = || m.write_lock("cw").wait(Duration::from_secs(20)).into_future();
    dropped_after_any_poll("a reader", held, reader, writer).await;
}

/// Drops a `waiter` (of what `held` keeps it from) after 1, 2, … polls, until one parks; after
/// each, releases `held` and has `retake` take it again at once (within 2 s): the dropped
/// waiter left nothing behind and was granted nothing.
async fn dropped_after_any_poll<W, R>(
    what: &str,
    mut held: crate::LockGuard,
    waiter: impl Fn() -> W,
    retake: impl Fn() -> R,
) where
    W: std::future::Future<Output = Result<crate::LockGuard, crate::LockError>>,
    R: std::future::Future<Output = Result<crate::LockGuard, crate::LockError>>,
{
    for polls in 1..=64 {
        let (got, parked) = poll_then_drop(waiter(), polls).await;
        assert!(got.is_none(), "{what} was granted what is held (poll {polls})");
        let released_at = Instant::now();
        held.release().await.expect("release");
        held = retake()
            .await
            .unwrap_or_else(|e| panic!("after dropping {what} at poll {polls}, the released lock stayed taken: {e}"));
        assert!(released_at.elapsed() < Duration::from_secs(2), "took {:?}", released_at.elapsed());
        if parked {
            break;
        }
        assert!(polls < 64, "{what} was still being polled after 64 polls without parking");
    }
    held.release().await.expect("release");
}
