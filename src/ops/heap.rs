//! Heap profiles in pprof's format, as Go's runtime makes them: [`Sampled`] wraps the process's
//! allocator and, while sampling is on ([`start`], with `pprofAddress` set), records the stack of about
//! one allocation per [`RATE`] bytes allocated, and forgets it when it is freed. [`profile`] turns
//! that into Go's four heap sample types (`alloc_objects`, `alloc_space`, `inuse_objects`,
//! `inuse_space`), each sample scaled up by the chance it had to be sampled (Go's
//! `scaleHeapSample`), so the figures estimate the whole heap, not just the samples.
//!
//! Costs: off, one relaxed atomic load per allocation and per free. On, a per-thread byte countdown
//! per allocation; per free, one load from a table of counters hashed by address, which is zero for
//! all but the sampled ones (and the few that share their counter), and only those take a lock. A
//! sampled allocation walks its stack (about one per 512 KiB allocated).
//!
//! Unlike Go's, the profile covers what was allocated since sampling started, not since the process
//! did: sampling is off until profiles are served. Live figures are right for what was allocated
//! since; memory allocated earlier and still in use is not in it.
//!
//! Inside an allocator nothing may allocate into itself or wait on itself: the sampler's own work
//! (the stack walk, its tables) runs with a per-thread `busy` flag on, under which allocations are not
//! sampled and frees do not look up (the sampler's own buffers are never sampled), so a thread never
//! takes the sampler's lock twice. Stacks are walked with the unwinder's unsynchronized walk, which
//! takes no lock of the backtrace crate.
//!
//! The binary installs it around mimalloc (`src/main.rs`); a program embedding the library with
//! another allocator gets no heap profile ([`start`] says so), never a wrong one.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};

/// Mean bytes allocated between two samples: Go's default `MemProfileRate`.
pub const RATE: usize = 512 * 1024;
/// Frames kept per stack (Go keeps 32; Rust's generic layers are deeper).
const DEPTH: usize = 64;
/// Counters of sampled addresses, by hash (a counting Bloom filter with one hash).
const COUNTERS: usize = 1 << 18;

const OFF: u8 = 0;
const PROBING: u8 = 1;
const ON: u8 = 2;
static MODE: AtomicU8 = AtomicU8::new(OFF);
static INSTALLED: AtomicU8 = AtomicU8::new(0);
static SAMPLED_BY_HASH: [AtomicU8; COUNTERS] = [const { AtomicU8::new(0) }; COUNTERS];
static BOOK: Mutex<Option<Book>> = Mutex::new(None);

struct Local {
    /// Bytes still to allocate before the next sample.
    countdown: Cell<i64>,
    /// This thread is in the sampler's own bookkeeping: its allocations are not sampled.
    busy: Cell<bool>,
    /// xorshift state; 0 until the thread's first allocation with sampling on.
    rng: Cell<u64>,
}

thread_local! {
    static LOCAL: Local = const { Local { countdown: Cell::new(0), busy: Cell::new(false), rng: Cell::new(0) } };
}

/// What is known of sampled allocations.
#[derive(Default)]
struct Book {
    /// Live sampled allocations: address → (stack, size).
    live: HashMap<usize, (usize, usize)>,
    stacks: HashMap<Box<[usize]>, usize>,
    /// By stack index: the stack and its sampled figures.
    by_stack: Vec<(Box<[usize]>, Figures)>,
}

#[derive(Clone, Copy, Default)]
struct Figures {
    allocs: u64,
    alloc_bytes: u64,
    frees: u64,
    free_bytes: u64,
}

/// The process's allocator `A`, with heap sampling (off until [`start`]).
#[derive(Debug, Default)]
pub struct Sampled<A>(pub A);

// SAFETY: every call is passed to `A` unchanged; the sampler only reads the pointers.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Sampled<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let ptr = unsafe { self.0.alloc(layout) };
        if MODE.load(Ordering::Relaxed) != OFF && !ptr.is_null() {
            allocated(ptr, layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let ptr = unsafe { self.0.alloc_zeroed(layout) };
        if MODE.load(Ordering::Relaxed) != OFF && !ptr.is_null() {
            allocated(ptr, layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Forgotten before it is freed: once freed, the address may be handed out and sampled again.
        if MODE.load(Ordering::Relaxed) != OFF {
            freed(ptr);
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let sampling = MODE.load(Ordering::Relaxed) != OFF;
        if sampling {
            freed(ptr);
        }
        // SAFETY: the caller's contract, passed on.
        let new = unsafe { self.0.realloc(ptr, layout, new_size) };
        if sampling && !new.is_null() {
            allocated(new, new_size);
        }
        new
    }
}

fn slot(ptr: usize) -> usize {
    // Fibonacci hashing of the address without its alignment bits.
    ((ptr >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (usize::BITS - 18)) % COUNTERS
}

fn allocated(ptr: *mut u8, size: usize) {
    if MODE.load(Ordering::Relaxed) == PROBING {
        INSTALLED.store(1, Ordering::Relaxed);
        return;
    }
    LOCAL.with(|local| {
        let size = i64::try_from(size).unwrap_or(i64::MAX);
        if local.rng.get() == 0 {
            // The thread's first allocation: seed it from its own address, start a countdown, no sample.
            local.rng.set((std::ptr::from_ref(local) as u64) | 1);
            local.countdown.set(next_countdown(local));
            return;
        }
        let left = local.countdown.get().saturating_sub(size);
        if left > 0 || local.busy.get() {
            local.countdown.set(left.max(1));
            return;
        }
        local.busy.set(true);
        local.countdown.set(next_countdown(local));
        record(ptr as usize, usize::try_from(size).unwrap_or(usize::MAX));
        local.busy.set(false);
    });
}

/// An exponentially distributed byte count with mean [`RATE`], as Go draws it: samples are then a
/// Poisson process over the bytes allocated, whatever the allocation sizes.
fn next_countdown(local: &Local) -> i64 {
    let mut x = local.rng.get();
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    local.rng.set(x);
    // A uniform number in (0, 1] from the top 53 bits.
    #[allow(clippy::cast_precision_loss)]
    let uniform = ((x >> 11) as f64 + 1.0) / (1_u64 << 53) as f64;
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    let bytes = (-uniform.ln() * RATE as f64) as i64;
    bytes.max(1)
}

fn record(ptr: usize, size: usize) {
    let mut frames = [0_usize; DEPTH];
    let mut depth = 0;
    // SAFETY: no lock of the backtrace crate is held here, and the sampler's own allocations during
    // the walk are not sampled (`busy`); unsynchronized walks of several threads at once are safe.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            let ip = frame.ip() as usize;
            // A zero return address is the end of a thread's stack, not a frame.
            if ip == 0 {
                return false;
            }
            frames[depth] = ip;
            depth += 1;
            depth < DEPTH
        });
    }
    let stack: Box<[usize]> = frames[..depth].into();
    let mut book = BOOK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let book = book.get_or_insert_with(Book::default);
    let next = book.by_stack.len();
    let index = *book.stacks.entry(stack.clone()).or_insert(next);
    if index == next {
        book.by_stack.push((stack, Figures::default()));
    }
    let figures = &mut book.by_stack[index].1;
    figures.allocs += 1;
    figures.alloc_bytes += size as u64;
    book.live.insert(ptr, (index, size));
    let counter = &SAMPLED_BY_HASH[slot(ptr)];
    // Saturates: a counter that reached the top stays there (its addresses are always looked up).
    let _ = counter.fetch_update(Ordering::Release, Ordering::Relaxed, |c| c.checked_add(1));
}

fn freed(ptr: *mut u8) {
    let ptr = ptr as usize;
    let counter = &SAMPLED_BY_HASH[slot(ptr)];
    if counter.load(Ordering::Acquire) == 0 {
        return;
    }
    LOCAL.with(|local| {
        // The sampler's own buffers were never sampled, and its lock may be held by this thread.
        if local.busy.get() {
            return;
        }
        local.busy.set(true);
        let mut book = BOOK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(book) = book.as_mut()
            && let Some((index, size)) = book.live.remove(&ptr)
        {
            let figures = &mut book.by_stack[index].1;
            figures.frees += 1;
            figures.free_bytes += size as u64;
            let _ = counter.fetch_update(Ordering::Release, Ordering::Relaxed, |c| match c {
                0 | u8::MAX => None,
                c => Some(c - 1),
            });
        }
        drop(book);
        local.busy.set(false);
    });
}

/// Turns sampling on, if [`Sampled`] is the process's allocator; whether it is.
pub fn start() -> bool {
    if MODE.load(Ordering::Relaxed) == ON {
        return true;
    }
    MODE.store(PROBING, Ordering::Relaxed);
    drop(std::hint::black_box(Box::new(0_u64)));
    let installed = INSTALLED.load(Ordering::Relaxed) == 1;
    MODE.store(if installed { ON } else { OFF }, Ordering::Relaxed);
    installed
}

/// Whether sampling is on.
#[must_use]
pub fn started() -> bool {
    MODE.load(Ordering::Relaxed) == ON
}

/// The heap profile so far, in pprof's format; `None` while sampling is off.
#[must_use]
pub fn profile() -> Option<pprof::protos::Profile> {
    if !started() {
        return None;
    }
    // A copy, so that symbolizing (slow, and allocating) runs without the lock.
    let stacks: Vec<(Box<[usize]>, Figures)> = LOCAL.with(|local| {
        local.busy.set(true);
        let book = BOOK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let copy = book.as_ref().map(|b| b.by_stack.clone()).unwrap_or_default();
        drop(book);
        local.busy.set(false);
        copy
    });
    Some(encode(&stacks))
}

/// Go's `scaleHeapSample`: `count` samples of `bytes` in all, at [`RATE`], as estimated totals.
#[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss, clippy::cast_sign_loss)]
fn scale(count: u64, bytes: u64) -> (i64, i64) {
    if count == 0 || bytes == 0 {
        return (0, 0);
    }
    let average = bytes as f64 / count as f64;
    let factor = 1.0 / (1.0 - (-average / RATE as f64).exp());
    ((count as f64 * factor) as i64, (bytes as f64 * factor) as i64)
}

/// The allocator's entry points (the sampler's `alloc` and those it may be inlined into).
fn is_allocation_entry(name: &str) -> bool {
    ["ops::heap::Sampled", "__rust_alloc", "__rust_realloc", "__rdl_", "__rg_"].iter().any(|part| name.contains(part))
}

/// How many frames at the leaf end of a stack belong to the sampler and the allocator: up to the last
/// allocation entry point among the first few (the sampler's own frames come before it), and the
/// `alloc::alloc` functions right after it that called it.
fn allocator_frames(frames: &[&[Symbol]]) -> usize {
    const WINDOW: usize = 24;
    let Some(entry) =
        frames.iter().take(WINDOW).rposition(|symbols| symbols.iter().any(|s| is_allocation_entry(&s.name)))
    else {
        return 0;
    };
    let callers = frames[entry + 1..]
        .iter()
        .take_while(|symbols| symbols.iter().all(|s| s.name.starts_with("alloc::alloc::")))
        .count();
    entry + 1 + callers
}

/// One function (of a frame, or inlined into it) at an address.
#[derive(Clone)]
struct Symbol {
    name: String,
    file: String,
    line: u32,
}

/// The functions at `address`, innermost first (inlined ones before the one they are inlined into).
fn resolve(address: usize) -> Vec<Symbol> {
    let mut symbols = Vec::new();
    backtrace::resolve(address as *mut std::ffi::c_void, |symbol| {
        symbols.push(Symbol {
            name: symbol.name().map_or_else(|| format!("{address:#x}"), |n| format!("{n:#}")),
            file: symbol.filename().map(|f| f.display().to_string()).unwrap_or_default(),
            line: symbol.lineno().unwrap_or(0),
        });
    });
    if symbols.is_empty() {
        symbols.push(Symbol { name: format!("{address:#x}"), file: String::new(), line: 0 });
    }
    symbols
}

/// Builds the pprof profile of `stacks`.
struct Encoder {
    profile: pprof::protos::Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, String), u64>,
    /// Address → (location id, its symbols).
    locations: HashMap<usize, (u64, Vec<Symbol>)>,
}

impl Encoder {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&id) = self.strings.get(s) {
            return id;
        }
        let id = i64::try_from(self.profile.string_table.len()).unwrap_or(i64::MAX);
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), id);
        id
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> pprof::protos::ValueType {
        let mut value_type = pprof::protos::ValueType::new();
        value_type.ty = self.string(kind);
        value_type.unit = self.string(unit);
        value_type
    }

    fn function(&mut self, symbol: &Symbol) -> u64 {
        let key = (symbol.name.clone(), symbol.file.clone());
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = u64::try_from(self.functions.len() + 1).unwrap_or(u64::MAX);
        let mut function = pprof::protos::Function::new();
        function.id = id;
        function.name = self.string(&symbol.name);
        function.system_name = function.name;
        function.filename = self.string(&symbol.file);
        self.profile.function.push(function);
        self.functions.insert(key, id);
        id
    }

    /// The location of `address`, resolved once.
    fn location(&mut self, address: usize) -> u64 {
        if let Some((id, _)) = self.locations.get(&address) {
            return *id;
        }
        let symbols = resolve(address);
        let id = u64::try_from(self.locations.len() + 1).unwrap_or(u64::MAX);
        let mut location = pprof::protos::Location::new();
        location.id = id;
        location.address = address as u64;
        for symbol in &symbols {
            let mut line = pprof::protos::Line::new();
            line.function_id = self.function(symbol);
            line.line = i64::from(symbol.line);
            location.line.push(line);
        }
        self.profile.location.push(location);
        self.locations.insert(address, (id, symbols));
        id
    }
}

fn encode(stacks: &[(Box<[usize]>, Figures)]) -> pprof::protos::Profile {
    let mut encoder = Encoder {
        profile: pprof::protos::Profile::new(),
        strings: HashMap::new(),
        functions: HashMap::new(),
        locations: HashMap::new(),
    };
    encoder.string("");
    for (kind, unit) in
        [("alloc_objects", "count"), ("alloc_space", "bytes"), ("inuse_objects", "count"), ("inuse_space", "bytes")]
    {
        let value_type = encoder.value_type(kind, unit);
        encoder.profile.sample_type.push(value_type);
    }
    encoder.profile.period_type = Some(encoder.value_type("space", "bytes")).into();
    encoder.profile.period = i64::try_from(RATE).unwrap_or(i64::MAX);
    encoder.profile.time_nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    for (stack, figures) in stacks {
        // Return addresses point after the call; the call is one byte before (not for the first
        // frame, which is where execution was).
        let ids: Vec<u64> = stack
            .iter()
            .enumerate()
            .map(|(depth, &ip)| encoder.location(if depth == 0 { ip } else { ip.saturating_sub(1) }))
            .collect();
        let symbols: Vec<&[Symbol]> = stack
            .iter()
            .enumerate()
            .map(|(depth, &ip)| {
                let address = if depth == 0 { ip } else { ip.saturating_sub(1) };
                encoder.locations[&address].1.as_slice()
            })
            .collect();
        let cut = allocator_frames(&symbols);
        let (alloc_objects, alloc_space) = scale(figures.allocs, figures.alloc_bytes);
        let (inuse_objects, inuse_space) =
            scale(figures.allocs - figures.frees, figures.alloc_bytes - figures.free_bytes);
        let mut sample = pprof::protos::Sample::new();
        sample.location_id = ids[cut..].to_vec();
        sample.value = vec![alloc_objects, alloc_space, inuse_objects, inuse_space];
        encoder.profile.sample.push(sample);
    }
    encoder.profile
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The unit tests' allocator, so the sampler is tested as it runs: around a real allocator, with
    /// every other test of the library allocating at the same time once sampling is on.
    #[global_allocator]
    static SAMPLED: Sampled<std::alloc::System> = Sampled(std::alloc::System);

    const BLOCK: usize = 4096;
    const BLOCKS: usize = 32 * 1024;

    #[inline(never)]
    fn allocate_blocks_to_be_profiled() -> Vec<Box<[u8]>> {
        (0..BLOCKS).map(|i| vec![u8::try_from(i % 251).unwrap(); BLOCK].into_boxed_slice()).collect()
    }

    /// (`alloc_space`, `inuse_space`) of the samples whose stack passes through `function`.
    fn space_of(profile: &pprof::protos::Profile, function: &str) -> (i64, i64) {
        let name_of = |id: u64| {
            let f = profile.function.iter().find(|f| f.id == id).unwrap();
            profile.string_table[usize::try_from(f.name).unwrap()].clone()
        };
        let passes = |sample: &pprof::protos::Sample| {
            sample.location_id.iter().any(|id| {
                let location = profile.location.iter().find(|l| l.id == *id).unwrap();
                location.line.iter().any(|line| name_of(line.function_id).contains(function))
            })
        };
        profile.sample.iter().filter(|s| passes(s)).fold((0, 0), |(a, i), s| (a + s.value[1], i + s.value[3]))
    }

    #[test]
    fn a_heap_profile_estimates_what_is_allocated_and_still_in_use() {
        assert!(start(), "the sampler is this test binary's allocator");
        let blocks = allocate_blocks_to_be_profiled();
        let total = i64::try_from(BLOCK * BLOCKS).unwrap();
        let profile = profile().expect("sampling is on");
        let types: Vec<&str> =
            profile.sample_type.iter().map(|t| profile.string_table[usize::try_from(t.ty).unwrap()].as_str()).collect();
        assert_eq!(types, ["alloc_objects", "alloc_space", "inuse_objects", "inuse_space"]);
        assert_eq!(profile.period, i64::try_from(RATE).unwrap());
        // 128 MiB at one sample per 512 KiB on average: about 256 samples, so within 30% but by
        // chance of well under one in a million.
        let (allocated, in_use) = space_of(&profile, "allocate_blocks_to_be_profiled");
        assert!((total * 7 / 10..total * 13 / 10).contains(&in_use), "in use {in_use}, allocated for real {total}");
        assert_eq!(allocated, in_use, "nothing freed yet");
        let leaf = profile.sample.iter().filter_map(|s| s.location_id.first()).any(|id| {
            let location = profile.location.iter().find(|l| l.id == *id).unwrap();
            let function = profile.function.iter().find(|f| f.id == location.line[0].function_id).unwrap();
            profile.string_table[usize::try_from(function.name).unwrap()].contains("Sampled")
        });
        assert!(!leaf, "the sampler's own frames are cut off every stack");

        drop(blocks);
        let (allocated_after, in_use_after) = space_of(&super::profile().unwrap(), "allocate_blocks_to_be_profiled");
        assert_eq!(in_use_after, 0, "every sampled block was freed");
        assert_eq!(allocated_after, allocated, "what was allocated stays counted");
    }

    #[test]
    fn samples_are_scaled_up_by_their_chance_of_being_sampled() {
        // One sample of a 512 KiB allocation had a 1 - 1/e chance: it stands for 1.58 of them.
        assert_eq!(scale(1, RATE as u64), (1, 829_411));
        // Large allocations are nearly always sampled: scaled by about 1.
        assert_eq!(scale(1, 100 * RATE as u64), (1, 100 * i64::try_from(RATE).unwrap()));
        // 100 samples of 64 bytes: each had a chance of about 64 / RATE.
        let (objects, bytes) = scale(100, 6_400);
        assert!((819_000..820_000).contains(&objects), "{objects}");
        assert_eq!(bytes / objects, 64);
        assert_eq!(scale(0, 0), (0, 0));
    }

    #[test]
    fn countdowns_average_the_rate() {
        let local = Local { countdown: Cell::new(0), busy: Cell::new(false), rng: Cell::new(0x1234_5678) };
        let n = 20_000;
        let total: i64 = (0..n).map(|_| next_countdown(&local)).sum();
        let mean = total / n;
        let rate = i64::try_from(RATE).unwrap();
        assert!((rate * 95 / 100..rate * 105 / 100).contains(&mean), "mean {mean}, rate {rate}");
    }

    #[test]
    fn the_sampler_and_allocator_frames_are_cut_off_the_leaf_end() {
        let frame = |names: &[&str]| -> Vec<Symbol> {
            names.iter().map(|n| Symbol { name: (*n).to_owned(), file: String::new(), line: 0 }).collect()
        };
        let stack = [
            frame(&["backtrace::backtrace::trace_unsynchronized"]),
            frame(&["metahook::ops::heap::record"]),
            frame(&["std::thread::local::LocalKey<T>::with"]),
            frame(&["<metahook::ops::heap::Sampled<A> as core::alloc::global::GlobalAlloc>::alloc", "__rg_alloc"]),
            frame(&["__rust_alloc"]),
            frame(&["alloc::alloc::exchange_malloc"]),
            frame(&["alloc::raw_vec::RawVec<T>::grow_one"]),
            frame(&["metahook::engine::sync::sync"]),
            frame(&["alloc::alloc::exchange_malloc"]),
        ];
        let frames: Vec<&[Symbol]> = stack.iter().map(Vec::as_slice).collect();
        assert_eq!(allocator_frames(&frames), 6, "up to __rust_alloc and its callers in alloc::alloc");
        assert_eq!(allocator_frames(&frames[6..]), 0, "a stack without an allocation entry keeps every frame");
    }
}
