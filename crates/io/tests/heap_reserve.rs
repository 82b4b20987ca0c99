//! `reserve_heap` under the `sluice` binary's allocator: the reserved
//! memory becomes resident and stays resident after it is freed, even when
//! the allocator is asked to return what it holds.

#[global_allocator]
static GLOBAL: sluice_io::alloc::Allocator = sluice_io::alloc::Allocator;

fn resident_bytes() -> u64 {
    sluice_io::mem::resident_bytes().expect("resident set size")
}

#[test]
fn reserved_heap_stays_resident_and_is_reused() {
    const MIB: usize = 1 << 20;
    let before = resident_bytes();
    let r = sluice_io::alloc::reserve_heap(64 * MIB);
    assert!(r.kept, "mimalloc is the global allocator here");
    assert_eq!(r.bytes, 64 * MIB);
    let after = resident_bytes();
    assert!(
        after >= before + 60 * MIB as u64,
        "resident {before} -> {after} bytes"
    );
    // mimalloc would return freed memory after its purge delay, and at
    // once when asked; with the reserve it keeps it.
    std::thread::sleep(std::time::Duration::from_millis(300));
    sluice_io::alloc::release_freed_memory();
    let kept = resident_bytes();
    assert!(
        kept >= before + 60 * MIB as u64,
        "resident {before} -> {after} -> {kept} bytes after a collect"
    );
    // Allocating 48 MiB again on another thread takes the resident pages:
    // the resident set grows by much less than that.
    std::thread::spawn(move || {
        let blocks: Vec<Vec<u8>> = (0..48 * 16).map(|_| vec![7u8; 65536 - 64]).collect();
        assert!(blocks.iter().all(|b| b[100] == 7));
        let grown = resident_bytes().saturating_sub(kept);
        assert!(grown < 16 * MIB as u64, "grew by {grown} bytes");
    })
    .join()
    .expect("allocating thread");
}
