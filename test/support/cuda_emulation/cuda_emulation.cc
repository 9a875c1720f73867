// The emulated CUDA runtime (cuda_runtime.h says what it is for and what it checks).
//
// One engine for the process, under one lock: a stream is a queue of work (kernels, copies,
// fills, event records and waits) that runs only when the host synchronizes with it. A kernel
// runs block after block on the synchronizing host thread. A block whose kernel uses barriers or
// warp shuffles runs its threads as fibers (their own stacks, switched by a few instructions of
// x86-64 assembly) that advance to the next barrier in turn; the first block of every kernel runs
// so, and a kernel that used none there runs its other blocks' threads as plain calls. Work that
// waits for other threads' work (the emulated NCCL's, engine.h) releases the lock while it waits;
// its stream runs nothing else meanwhile.
#include "test/support/cuda_emulation/cuda_runtime.h"

#include "test/support/cuda_emulation/engine.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#if !defined(__x86_64__)
#error "the CUDA emulation's fibers switch stacks with x86-64 assembly"
#endif

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define GC_EMU_ASAN 1
#else
#define GC_EMU_ASAN 0
#endif

// Under TSan a block's threads are fibers TSan knows (a context each), switched without
// synchronizing: TSan sees them as concurrent threads, ordered only by what orders a GPU's threads
// (the block's start and end, __syncthreads, __syncwarp), and reports their data races as it does
// host threads'. The fibers' machinery is not instrumented (GC_EMU_MACHINERY): its bookkeeping
// of the block is the scheduler's, not the kernel's.
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define GC_EMU_TSAN 1
#define GC_EMU_MACHINERY __attribute__((no_sanitize_thread, noinline))
#else
#define GC_EMU_TSAN 0
#define GC_EMU_MACHINERY
#endif

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

struct CUstream_st {
  struct Work {
    std::function<void()> run;
    std::vector<const void*> touches;  // device memory it may access (whole allocations open)
  };
  std::deque<Work> work;
  unsigned flags = 0;
  int device = 0;
  std::thread::id runner;  // the thread running its front work now, if any
};

struct CUevent_st {
  CUstream_st* stream = nullptr;
  uint64_t recorded = 0;   // records so far
  uint64_t completed = 0;  // the last record whose point its stream has passed
  bool reported_pending = false;
};

// Saves the callee-saved registers on the current stack, stores its pointer at *save, and
// continues on the stack `to` (one this function saved, or a new fiber's: FiberStack).
extern "C" void gc_cuda_emulation_switch(void** save, void* to);
asm(R"(
  .text
  .globl gc_cuda_emulation_switch
  .type gc_cuda_emulation_switch, @function
gc_cuda_emulation_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size gc_cuda_emulation_switch, .-gc_cuda_emulation_switch
)");

namespace gc_cuda_emulation {

void Fatal(const std::string& what) {
  std::fprintf(stderr, "gradcomp CUDA emulation: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

namespace {

// ---- memory -----------------------------------------------------------------------------------

struct Allocation {
  char* map = nullptr;  // the mapping: its data pages, then one guard page
  size_t map_bytes = 0;
  size_t bytes = 0;     // what was asked for
  bool device = false;  // else page-locked host memory
  int ordinal = -1;     // the device's, for device memory
  int open = 0;         // work running that may touch it
};

std::recursive_mutex mu;
thread_local int held = 0;  // times this thread holds mu
std::mutex change_mu;
std::condition_variable changed;
uint64_t generation = 0;  // under change_mu: changes of state so far (Notify)

std::map<uintptr_t, Allocation> allocations;  // by the pointer handed out
cudaError_t sticky = cudaSuccess;             // a kernel's fault poisons the context, as CUDA's
thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;
constexpr int kMaxDevices = 16;
CUstream_st legacy_streams[kMaxDevices];
std::set<CUstream_st*> streams;
// Destroyed streams stay allocated: a thread that drained one while it waited may look at it again.
std::vector<std::unique_ptr<CUstream_st>> destroyed_streams;
std::set<CUevent_st*> events;

// GRADCOMP_CUDA_EMULATION_DEVICES GPUs (8 unless set), each with its own memory and streams.
int Devices() {
  static const int devices = [] {
    const char* v = std::getenv("GRADCOMP_CUDA_EMULATION_DEVICES");
    if (v == nullptr) return 8;
    const int n = std::atoi(v);
    if (n < 1 || n > kMaxDevices) {
      Fatal(std::string("GRADCOMP_CUDA_EMULATION_DEVICES=") + v + " is not a count from 1 to " +
            std::to_string(kMaxDevices));
    }
    return n;
  }();
  return devices;
}

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// GRADCOMP_CUDA_EMULATION_CLOSED_MEMORY=0 leaves device memory open to the host (guard pages
// stay): for long tests whose host code the separate-memory device already checks.
bool ClosedMemory() {
  static const bool closed = [] {
    const char* v = std::getenv("GRADCOMP_CUDA_EMULATION_CLOSED_MEMORY");
    return v == nullptr || std::string(v) != "0";
  }();
  return closed;
}

void Protect(const Allocation& a, bool open) {
  if (!ClosedMemory()) return;
  if (mprotect(a.map, a.map_bytes - PageSize(), open ? PROT_READ | PROT_WRITE : PROT_NONE) != 0) {
    Fatal("mprotect failed");
  }
}

// The entry (start, allocation) of the allocation holding [p, p + bytes), or allocations.end().
// With bytes 0, p may be one past its end (a kernel's pointer argument may be).
std::map<uintptr_t, Allocation>::iterator Holding(const void* p, size_t bytes) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = allocations.upper_bound(addr);
  if (it == allocations.begin()) return allocations.end();
  --it;
  if (addr - it->first + bytes > it->second.bytes) return allocations.end();
  return it;
}

// The allocation holding [p, p + bytes), or null.
Allocation* Find(const void* p, size_t bytes) {
  const auto it = Holding(p, bytes);
  return it == allocations.end() ? nullptr : &it->second;
}

bool IsDevice(const void* p, size_t bytes) {
  const Allocation* a = Find(p, bytes);
  return a != nullptr && a->device;
}

// While one lives, the device memory a piece of stream work names is open to the host thread
// that runs it; the rest stays closed, so a kernel reaching memory its arguments do not name
// faults too.
class OpenFor {
 public:
  explicit OpenFor(const std::vector<const void*>& pointers) {
    for (const void* p : pointers) {
      Allocation* a = Find(p, 0);
      if (a == nullptr || !a->device) continue;
      if (a->open++ == 0) Protect(*a, true);
      opened_.push_back(a);
    }
  }
  ~OpenFor() {
    for (Allocation* a : opened_) {
      if (--a->open == 0) Protect(*a, false);
    }
  }
  OpenFor(const OpenFor&) = delete;
  OpenFor& operator=(const OpenFor&) = delete;

 private:
  std::vector<Allocation*> opened_;
};

// Faults on device memory from the host name the allocation; anything else is passed on.
struct sigaction previous_segv;
void OnSegv(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const auto& [p, a] : allocations) {  // not async-signal-safe; the process is ending
    const auto start = reinterpret_cast<uintptr_t>(a.map);
    if (addr < start || addr >= start + a.map_bytes) continue;
    char line[256];
    if (addr >= start + a.map_bytes - PageSize()) {
      std::snprintf(line, sizeof line, "gradcomp CUDA emulation: an access at %p is past the end of the %zu bytes "
                    "of %s memory at %p\n", info->si_addr, a.bytes, a.device ? "device" : "page-locked",
                    reinterpret_cast<void*>(p));
    } else {
      std::snprintf(line, sizeof line, "gradcomp CUDA emulation: the host touched device memory at %p (%zu bytes "
                    "at %p) outside the stream work that names it: the host must copy it out first, and a kernel may "
                    "reach only the memory its arguments point into\n", info->si_addr, a.bytes,
                    reinterpret_cast<void*>(p));
    }
    if (write(2, line, std::strlen(line)) < 0) break;
    break;
  }
  sigaction(SIGSEGV, &previous_segv, nullptr);
  if (previous_segv.sa_flags & SA_SIGINFO) {
    if (previous_segv.sa_sigaction != nullptr) previous_segv.sa_sigaction(sig, info, context);
  } else if (previous_segv.sa_handler != SIG_DFL && previous_segv.sa_handler != SIG_IGN) {
    previous_segv.sa_handler(sig);
  }
  // Returning re-runs the access under the handler restored above.
}

void InstallSegvHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnSegv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous_segv);
  });
}

cudaError_t Allocate(void** ptr, size_t bytes, bool device) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  InstallSegvHandler();
  const size_t page = PageSize();
  const size_t rounded = RoundUp(std::max<size_t>(bytes, 1), 256);  // cudaMalloc's alignment
  Allocation a;
  a.map_bytes = RoundUp(rounded, page) + page;
  a.bytes = bytes;
  a.device = device;
  a.ordinal = device ? current_device : -1;
  void* m = mmap(nullptr, a.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return cudaErrorMemoryAllocation;
  a.map = static_cast<char*>(m);
  if (mprotect(a.map + a.map_bytes - page, page, PROT_NONE) != 0) Fatal("mprotect of a guard page failed");
  // The data ends where the guard page starts; cudaMalloc's memory is not zeroed: 0xff bytes are
  // NaN in every float type, so a kernel reading what nothing wrote shows.
  char* user = a.map + a.map_bytes - page - rounded;
  std::memset(a.map, 0xff, a.map_bytes - page);
  if (device) Protect(a, false);
  allocations[reinterpret_cast<uintptr_t>(user)] = a;
  *ptr = user;
  return cudaSuccess;
}

// ---- streams ----------------------------------------------------------------------------------

// The null stream is the current device's legacy stream.
CUstream_st* Resolve(cudaStream_t s) {
  if (s != nullptr) return s;
  CUstream_st* legacy = &legacy_streams[current_device];
  legacy->device = current_device;
  return legacy;
}

bool Known(cudaStream_t s) { return s == nullptr || streams.count(s) > 0; }

// Another thread runs s's front work: s's next work waits for it (work that waits for peers
// releases the engine's lock meanwhile).
bool BusyElsewhere(const CUstream_st* s) {
  return s->runner != std::thread::id() && s->runner != std::this_thread::get_id();
}

void RunOne(CUstream_st* s) {
  CUstream_st::Work work = std::move(s->work.front());
  s->work.pop_front();
  if (sticky != cudaSuccess) return;  // a poisoned context runs nothing more
  const std::thread::id outer = s->runner;
  s->runner = std::this_thread::get_id();
  {
    OpenFor open(work.touches);
    work.run();
  }
  s->runner = outer;
  Notify();
}

void Drain(CUstream_st* s) {
  for (;;) {
    if (BusyElsewhere(s)) {
      WaitForChange();
    } else if (s->work.empty()) {
      return;
    } else {
      RunOne(s);
    }
  }
}

// Every stream of `device`: what they hold when called runs (what other threads enqueue while
// this waits may run too).
void DrainDevice(int device) {
  Drain(&legacy_streams[device]);
  std::vector<CUstream_st*> of_device;
  for (CUstream_st* s : streams) {
    if (s->device == device) of_device.push_back(s);
  }
  for (CUstream_st* s : of_device) Drain(s);  // one destroyed meanwhile is empty (destroyed_streams)
}

// Runs e's stream until e's record number `seq` has passed.
void RunToEvent(CUevent_st* e, uint64_t seq) {
  while (e->completed < seq && sticky == cudaSuccess) {
    CUstream_st* s = e->stream;
    if (s == nullptr) return;  // destroyed meanwhile, after its work ran
    if (BusyElsewhere(s)) {
      WaitForChange();
      continue;
    }
    if (s->work.empty()) Fatal("an event's stream ran out of work before the event's point");
    RunOne(s);
  }
}

void Push(cudaStream_t s, std::function<void()> run, std::vector<const void*> touches = {}) {
  Resolve(s)->work.push_back(CUstream_st::Work{std::move(run), std::move(touches)});
}

cudaError_t Fail(cudaError_t e) {
  last_error = e;
  return e;
}

// ---- fibers -----------------------------------------------------------------------------------

constexpr size_t kFiberStack = size_t{256} << 10;

struct Fiber {
  enum State { kReady, kAtBarrier, kAtShuffle, kDone };
  void* sp = nullptr;
  State state = kReady;
  uint3 tid;
  unsigned mask = 0;       // at a shuffle: its mask
  unsigned shuffles = 0;   // shuffles done (their slots alternate)
  unsigned barriers = 0;   // __syncthreads passed (TSan's tokens alternate)
  unsigned warp_syncs = 0; // __syncwarp passed
};

// One block being run on this host thread.
struct Block {
  const std::function<void()>* thread = nullptr;
  const char* kernel = "";
  bool fibers = false;          // else threads run as plain calls
  bool used_barriers = false;   // __syncthreads or a shuffle, in any block so far
  bool used_syncthreads = false;
  // Under TSan: whether this block's start follows what came before it (the launch, the block
  // before), and whether what comes after follows its end.
  bool ordered_start = true, ordered_end = true;
  std::vector<Fiber> all;
  size_t current = 0;
  void* scheduler_sp = nullptr;
  // Warp shuffles: two slots per lane (consecutive shuffles alternate), 8 bytes each.
  std::vector<uint64_t> slots;
#if GC_EMU_ASAN
  const void* scheduler_bottom = nullptr;  // the host thread's stack
  size_t scheduler_size = 0;
#endif
#if GC_EMU_TSAN
  void* scheduler_fiber = nullptr;  // the host thread's TSan context
#endif
};
thread_local Block* running = nullptr;

#if GC_EMU_TSAN
// TSan's contexts for the fibers of a block (one per thread of the block, kept from block to
// block and for the process: blocks run one at a time, under the engine's lock, so the largest
// block's count is all there are, and TSan's vector clocks stay that short), and the addresses
// whose release and acquire order them: a block's start (the scheduler releases, each fiber
// acquires), its end (the reverse), each barrier (every arriving thread releases, every released
// one acquires; two tokens, alternating, so that a thread already past a barrier orders nothing
// of the next one's interval), and each warp's __syncwarp. A kernel's first block's start and
// its last block's end are ordered (the launch before, the host after); the blocks in between
// only in a kernel that calls __syncthreads, whose shared memory (one host variable for every
// block) the next block reuses. Ordering every block costs TSan two vector-clock merges a
// thread (twice the time of the runtime's test); context i runs thread i of every block, so the
// blocks of a kernel without shared memory need none.
struct TsanFibers {
  std::vector<void*> contexts;
  char start = 0, end = 0, barrier[2] = {0, 0};
  std::vector<char> warp;  // two per warp
  GC_EMU_MACHINERY void* Context(size_t i) {
    while (contexts.size() <= i) contexts.push_back(__tsan_create_fiber(0));
    return contexts[i];
  }
};
TsanFibers& tsan = *new TsanFibers;  // under the engine's lock; never destroyed (work may run at exit)
#define GC_EMU_TSAN_RELEASE(token) __tsan_release(&(token))
#define GC_EMU_TSAN_ACQUIRE(token) __tsan_acquire(&(token))
#else
#define GC_EMU_TSAN_RELEASE(token) ((void)0)
#define GC_EMU_TSAN_ACQUIRE(token) ((void)0)
#endif

struct Stacks {
  char* base = nullptr;
  size_t count = 0;
  ~Stacks() {
    if (base != nullptr) munmap(base, count * kFiberStack);
  }
  char* Get(size_t i) {
    if (i >= count) {
      if (base != nullptr) munmap(base, count * kFiberStack);
      count = std::max<size_t>(i + 1, 256);
      void* m = mmap(nullptr, count * kFiberStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
      if (m == MAP_FAILED) Fatal("no memory for fiber stacks");
      base = static_cast<char*>(m);
    }
    return base + i * kFiberStack;
  }
};
thread_local Stacks stacks;

// Leaves the stack of the fiber at `from` (the scheduler: b.all.size()) for the next fiber
// after it that is ready to run, or for the scheduler when none is: fibers hand over to each
// other directly, the scheduler only releases barriers.
GC_EMU_MACHINERY void SwitchFrom(Block& b, size_t from, bool finished) {
  const size_t n = b.all.size();
  size_t to = from < n ? from + 1 : 0;
  while (to < n && b.all[to].state != Fiber::kReady) ++to;
  void** save = from < n ? &b.all[from].sp : &b.scheduler_sp;
  void* target = to < n ? b.all[to].sp : b.scheduler_sp;
  if (to < n) {
    b.current = to;
    threadIdx = b.all[to].tid;
  }
#if GC_EMU_TSAN
  __tsan_switch_to_fiber(to < n ? tsan.Context(to) : b.scheduler_fiber, __tsan_switch_to_fiber_no_sync);
#endif
#if GC_EMU_ASAN
  void* fake = nullptr;
  if (to < n) {
    __sanitizer_start_switch_fiber(finished ? nullptr : &fake, stacks.Get(to), kFiberStack);
  } else {
    __sanitizer_start_switch_fiber(finished ? nullptr : &fake, b.scheduler_bottom, b.scheduler_size);
  }
  gc_cuda_emulation_switch(save, target);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  (void)finished;
  gc_cuda_emulation_switch(save, target);
#endif
}

extern "C" [[noreturn]] GC_EMU_MACHINERY void FiberMain() {
  Block& b = *running;
#if GC_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
  if (b.ordered_start) GC_EMU_TSAN_ACQUIRE(tsan.start);
  (*b.thread)();
  if (b.ordered_end) GC_EMU_TSAN_RELEASE(tsan.end);
  const size_t me = b.current;
  b.all[me].state = Fiber::kDone;
  SwitchFrom(b, me, true);
  Fatal("a finished fiber was resumed");
}

GC_EMU_MACHINERY void* NewFiberStack(char* base) {
#if GC_EMU_ASAN
  // A finished fiber's last frame never returned: its redzones are still poisoned.
  ASAN_UNPOISON_MEMORY_REGION(base, kFiberStack);
#endif
  auto top = (reinterpret_cast<uintptr_t>(base) + kFiberStack) & ~uintptr_t{15};
  auto** sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;  // FiberMain's return address: it never returns
  *--sp = reinterpret_cast<void*>(&FiberMain);
  for (int i = 0; i < 6; ++i) *--sp = nullptr;  // rbp, rbx, r12-r15
  return sp;
}

unsigned LinearId(const uint3& t, const dim3& d) { return t.x + d.x * (t.y + d.y * t.z); }

GC_EMU_MACHINERY Fiber& Self(const char* what) {
  Block* b = running;
  if (b == nullptr) Fatal(std::string(what) + " called outside a kernel");
  if (!b->fibers) {
    Fatal(std::string("kernel ") + b->kernel + " called " + what + " in a block run without fibers: its first "
          "block used no barrier, so the emulation took it for a kernel without any");
  }
  b->used_barriers = true;
  return b->all[b->current];
}

GC_EMU_MACHINERY void Yield(Block& b) { SwitchFrom(b, b.current, false); }

std::string Describe(const Block& b) {
  std::string s;
  for (const Fiber& f : b.all) {
    static const char* names[] = {"ready", "at __syncthreads", "at a shuffle", "done"};
    s += " " + std::to_string(LinearId(f.tid, blockDim)) + ":" + names[f.state];
    if (s.size() > 600) return s + " ...";
  }
  return s;
}

// Releases the fibers whose barrier every participant has reached; false if none can go on.
GC_EMU_MACHINERY bool Release(Block& b) {
  size_t live = 0, at_barrier = 0;
  for (const Fiber& f : b.all) {
    live += f.state != Fiber::kDone;
    at_barrier += f.state == Fiber::kAtBarrier;
  }
  if (live > 0 && at_barrier == live) {
    for (Fiber& f : b.all) f.state = Fiber::kReady;
    return true;
  }
  bool released = false;
  const size_t n = b.all.size();
  for (size_t first = 0; first < n; first += 32) {
    const size_t lanes = std::min<size_t>(32, n - first);
    unsigned waiting = 0, done = 0, mask = 0;
    bool same = true;
    for (size_t l = 0; l < lanes; ++l) {
      const Fiber& f = b.all[first + l];
      done |= static_cast<unsigned>(f.state == Fiber::kDone) << l;
      if (f.state != Fiber::kAtShuffle) continue;
      if (waiting != 0 && f.mask != mask) same = false;
      waiting |= 1u << l;
      mask = f.mask;
    }
    if (waiting == 0) continue;
    const unsigned absent = lanes == 32 ? 0 : ~0u << lanes;
    if (mask & (done | absent)) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "%08x", mask);
      Fatal(std::string("kernel ") + b.kernel + ": a warp shuffle's mask 0x" + hex + " in warp " +
            std::to_string(first / 32) + " of block " + std::to_string(blockIdx.x) +
            " names a lane that has exited or does not exist");
    }
    if (!same || waiting != mask) continue;
    for (size_t l = 0; l < lanes; ++l) {
      if (waiting & (1u << l)) b.all[first + l].state = Fiber::kReady;
    }
    released = true;
  }
  return released;
}

GC_EMU_MACHINERY void RunBlockWithFibers(Block& b) {
  const size_t n = static_cast<size_t>(blockDim.x) * blockDim.y * blockDim.z;
  b.all.assign(n, Fiber{});
  b.slots.assign(2 * n, 0);
  stacks.Get(n - 1);  // every stack now: growing the pool moves it
  for (size_t i = 0; i < n; ++i) {
    Fiber& f = b.all[i];
    f.tid = uint3(static_cast<unsigned>(i % blockDim.x), static_cast<unsigned>(i / blockDim.x % blockDim.y),
                  static_cast<unsigned>(i / (size_t{blockDim.x} * blockDim.y)));
    f.sp = NewFiberStack(stacks.Get(i));
  }
#if GC_EMU_ASAN
  pthread_attr_t attr;
  void* bottom = nullptr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) Fatal("pthread_getattr_np failed");
  pthread_attr_getstack(&attr, &bottom, &b.scheduler_size);
  pthread_attr_destroy(&attr);
  b.scheduler_bottom = bottom;
#endif
#if GC_EMU_TSAN
  b.scheduler_fiber = __tsan_get_current_fiber();
  tsan.Context(n - 1);
  tsan.warp.assign((n + 31) / 32 * 2, 0);
#endif
  if (b.ordered_start) GC_EMU_TSAN_RELEASE(tsan.start);
  for (;;) {
    SwitchFrom(b, n, false);  // the ready fibers run, each handing over to the next
    bool all_done = true;
    for (const Fiber& f : b.all) all_done = all_done && f.state == Fiber::kDone;
    if (all_done) {
      if (b.ordered_end) GC_EMU_TSAN_ACQUIRE(tsan.end);
      return;
    }
    if (!Release(b)) {
      Fatal(std::string("kernel ") + b.kernel + ", block " + std::to_string(blockIdx.x) +
            ": its threads wait at barriers that not every live thread reaches:" + Describe(b));
    }
  }
}

// Which kernels use barriers, learned from their first block (by kernel address).
std::map<const void*, bool> uses_barriers;

GC_EMU_MACHINERY void RunGrid(const char* name, const void* kernel, const Config& c, int device,
             const std::vector<const void*>& pointers, const std::function<void()>& thread) {
  for (size_t i = 0; i < pointers.size(); ++i) {
    const void* p = pointers[i];
    const Allocation* a = p == nullptr ? nullptr : Find(p, 0);
    if (p == nullptr || (a != nullptr && (!a->device || a->ordinal == device))) continue;
    if (a == nullptr) {
      std::fprintf(stderr,
                   "gradcomp CUDA emulation: kernel %s's pointer argument %zu (%p) is neither device nor page-locked "
                   "memory: an illegal address on a GPU\n",
                   name, i, p);
    } else {
      std::fprintf(stderr,
                   "gradcomp CUDA emulation: kernel %s on device %d: its pointer argument %zu (%p) is device %d's "
                   "memory: an illegal address without peer access\n",
                   name, device, i, p, a->ordinal);
    }
    sticky = cudaErrorIllegalAddress;
    return;
  }
  Block b;
  b.thread = &thread;
  b.kernel = name;
  Block* outer = running;
  running = &b;
  gridDim = c.grid;
  blockDim = c.block;
  auto known = uses_barriers.find(kernel);
  for (unsigned z = 0; z < c.grid.z; ++z) {
    for (unsigned y = 0; y < c.grid.y; ++y) {
      for (unsigned x = 0; x < c.grid.x; ++x) {
        blockIdx = uint3(x, y, z);
        const bool first = x == 0 && y == 0 && z == 0;
        const bool last = x + 1 == c.grid.x && y + 1 == c.grid.y && z + 1 == c.grid.z;
        b.ordered_start = first || b.used_syncthreads;
        b.ordered_end = first || last || b.used_syncthreads;
        // Under TSan every block's threads are fibers: its threads' races are what it checks.
        b.fibers = GC_EMU_TSAN || known == uses_barriers.end() || known->second;
        if (b.fibers) {
          RunBlockWithFibers(b);
          if (known == uses_barriers.end()) known = uses_barriers.emplace(kernel, b.used_barriers).first;
          continue;
        }
        for (unsigned tz = 0; tz < c.block.z; ++tz) {
          for (unsigned ty = 0; ty < c.block.y; ++ty) {
            for (unsigned tx = 0; tx < c.block.x; ++tx) {
              threadIdx = uint3(tx, ty, tz);
              thread();
            }
          }
        }
      }
    }
  }
  running = outer;
}

}  // namespace

void Enqueue(const char* name, const void* kernel, const Config& c, std::vector<const void*> pointers,
             std::function<void()> thread) {
  EngineLock lock;
  const size_t threads = static_cast<size_t>(c.block.x) * c.block.y * c.block.z;
  if (c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 || threads == 0 || threads > 1024 || c.block.z > 64 ||
      c.grid.x > 0x7fffffffu || c.grid.y > 65535 || c.grid.z > 65535 || c.shared_bytes > 48 * 1024) {
    last_error = cudaErrorInvalidConfiguration;
    return;
  }
  if (!Known(c.stream)) {
    last_error = cudaErrorInvalidResourceHandle;
    return;
  }
  if (sticky != cudaSuccess) return;
  std::vector<const void*> touches = pointers;
  const int device = Resolve(c.stream)->device;
  Push(
      c.stream, [name, kernel, c, device, pointers = std::move(pointers), thread = std::move(thread)] {
        RunGrid(name, kernel, c, device, pointers, thread);
      },
      std::move(touches));
}

GC_EMU_MACHINERY uint64_t WarpShuffle(unsigned mask, Shuffle how, int arg, int width, uint64_t value) {
  Fiber& f = Self("a warp shuffle");
  Block& b = *running;
  const size_t me = b.current;
  const unsigned lane = static_cast<unsigned>(me % 32);
  if (!(mask & (1u << lane))) Fatal(std::string("kernel ") + b.kernel + ": a shuffle's mask leaves out its own lane");
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0) Fatal("a shuffle's width is not a power of 2 up to 32");
  const unsigned slot = f.shuffles++ % 2;
  b.slots[2 * me + slot] = value;
  f.state = Fiber::kAtShuffle;
  f.mask = mask;
  Yield(b);
  const int w = width, base = static_cast<int>(lane) / w * w, in = static_cast<int>(lane) - base;
  int src = in;
  switch (how) {
    case Shuffle::kIndex: src = arg % w; break;
    case Shuffle::kXor: src = in ^ arg; break;
    case Shuffle::kDown: src = in + arg; break;
    case Shuffle::kUp: src = in - arg; break;
  }
  if (src < 0 || src >= w) src = in;  // outside the segment: the lane's own value
  const size_t from = me - lane + static_cast<size_t>(base + src);
  if (!(mask & (1u << (base + src)))) {
    Fatal(std::string("kernel ") + b.kernel + ": a shuffle reads lane " + std::to_string(base + src) +
          ", which its mask leaves out");
  }
  return b.slots[2 * from + slot];
}

// ---- the engine, for the emulated NCCL (engine.h) ---------------------------------------------

EngineLock::EngineLock() {
  mu.lock();
  ++held;
}

EngineLock::~EngineLock() {
  --held;
  mu.unlock();
}

void WaitForChange() {
  uint64_t seen = 0;
  {
    std::lock_guard<std::mutex> g(change_mu);
    seen = generation;
  }
  const int depth = held;
  for (int i = 0; i < depth; ++i) mu.unlock();
  held = 0;
  {
    std::unique_lock<std::mutex> g(change_mu);
    changed.wait_for(g, std::chrono::seconds(1), [&] { return generation != seen; });
  }
  for (int i = 0; i < depth; ++i) mu.lock();
  held = depth;
}

void Notify() {
  std::lock_guard<std::mutex> g(change_mu);
  ++generation;
  changed.notify_all();
}

cudaError_t EnqueueWork(cudaStream_t stream, std::function<void()> run, std::vector<const void*> touches) {
  EngineLock lock;
  if (sticky != cudaSuccess) return sticky;
  if (!Known(stream)) return Fail(cudaErrorInvalidResourceHandle);
  Push(stream, std::move(run), std::move(touches));
  return cudaSuccess;
}

int DeviceOf(const void* p, size_t bytes) {
  EngineLock lock;
  const Allocation* a = Find(p, bytes);
  return a != nullptr && a->device ? a->ordinal : -1;
}

std::string DescribeMemory(const void* p, size_t bytes) {
  EngineLock lock;
  const auto it = Holding(p, 0);
  if (it == allocations.end()) return "pageable host memory";
  const Allocation& a = it->second;
  if (!a.device) return "page-locked host memory";
  const size_t offset = reinterpret_cast<uintptr_t>(p) - it->first;
  return "GPU " + std::to_string(a.ordinal) + "'s memory at byte " + std::to_string(offset) + " of an allocation of " +
         std::to_string(a.bytes) + (offset + bytes > a.bytes ? " bytes, which it overruns" : " bytes");
}

int DeviceOfStream(cudaStream_t stream) {
  EngineLock lock;
  return Known(stream) ? Resolve(stream)->device : -1;
}

}  // namespace gc_cuda_emulation

using namespace gc_cuda_emulation;  // NOLINT: the C-style API below is global, as CUDA's

GC_EMU_MACHINERY void __syncthreads() {
  Fiber& f = Self("__syncthreads");
  f.state = Fiber::kAtBarrier;
  running->used_syncthreads = true;
  GC_EMU_TSAN_RELEASE(tsan.barrier[f.barriers % 2]);
  Yield(*running);
  GC_EMU_TSAN_ACQUIRE(tsan.barrier[f.barriers++ % 2]);
}

// A shuffle orders no memory, __syncwarp orders the memory of the lanes it names.
GC_EMU_MACHINERY void __syncwarp(unsigned mask) {
  Fiber& f = Self("__syncwarp");
  [[maybe_unused]] char* token = nullptr;
#if GC_EMU_TSAN
  token = &tsan.warp[running->current / 32 * 2 + f.warp_syncs % 2];
#endif
  GC_EMU_TSAN_RELEASE(*token);
  WarpShuffle(mask, Shuffle::kIndex, static_cast<int>(running->current % 32), 32, 0);
  GC_EMU_TSAN_ACQUIRE(*token);
  ++f.warp_syncs;
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return Fail(cudaErrorInvalidValue);
  *count = Devices();
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return Fail(cudaErrorInvalidValue);
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= Devices()) return Fail(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  EngineLock lock;
  DrainDevice(current_device);
  return sticky;
}

cudaError_t cudaGetLastError() {
  if (sticky != cudaSuccess) return sticky;
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return sticky != cudaSuccess ? sticky : last_error; }

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorNotSupported: return "operation not supported";
  }
  return "unrecognized error code";
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  EngineLock lock;
  if (sticky != cudaSuccess) return sticky;
  return Allocate(ptr, bytes, true) == cudaSuccess ? cudaSuccess : Fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  EngineLock lock;
  if (sticky != cudaSuccess) return sticky;
  return Allocate(ptr, bytes, false) == cudaSuccess ? cudaSuccess : Fail(cudaErrorMemoryAllocation);
}

namespace {
cudaError_t FreeAllocation(void* ptr, bool device) {
  if (ptr == nullptr) return cudaSuccess;
  EngineLock lock;
  auto it = allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations.end() || it->second.device != device) return Fail(cudaErrorInvalidValue);
  DrainDevice(device ? it->second.ordinal : current_device);  // cudaFree and cudaFreeHost synchronize the device
  it = allocations.find(reinterpret_cast<uintptr_t>(ptr));   // (the drain may have waited, unlocked)
  if (it == allocations.end()) return Fail(cudaErrorInvalidValue);
  munmap(it->second.map, it->second.map_bytes);
  allocations.erase(it);
  return sticky;
}
}  // namespace

cudaError_t cudaFree(void* ptr) { return FreeAllocation(ptr, true); }
cudaError_t cudaFreeHost(void* ptr) { return FreeAllocation(ptr, false); }

namespace {

// Where a copy's pointers are, as its kind says they must be: InvalidValue otherwise.
bool KindHolds(bool src_device, bool dst_device, cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToDevice: return dst_device && !src_device;
    case cudaMemcpyDeviceToHost: return src_device && !dst_device;
    case cudaMemcpyDeviceToDevice: return src_device && dst_device;
    case cudaMemcpyHostToHost: return !src_device && !dst_device;
    case cudaMemcpyDefault: return true;
  }
  return false;
}

cudaError_t CopyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  if (sticky != cudaSuccess) return sticky;
  if (!Known(stream)) return Fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return Fail(cudaErrorInvalidValue);
  const Allocation* from = Find(src, bytes);  // null: pageable host memory
  const Allocation* to = Find(dst, bytes);
  if (!KindHolds(from != nullptr && from->device, to != nullptr && to->device, kind)) {
    return Fail(cudaErrorInvalidValue);
  }
  const bool from_pageable = from == nullptr, to_pageable = to == nullptr;
  if (from_pageable) {
    // CUDA stages pageable source bytes before returning; the copy itself keeps its place.
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    Push(stream, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); }, {dst});
  } else {
    Push(stream, [dst, src, bytes] { std::memcpy(dst, src, bytes); }, {dst, src});
  }
  // A copy into pageable memory returns once it is done (and so is all before it on the stream).
  if (to_pageable) Drain(Resolve(stream));
  return sticky;
}

}  // namespace

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  EngineLock lock;
  return CopyAsync(dst, src, bytes, kind, stream);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  EngineLock lock;
  const cudaError_t e = CopyAsync(dst, src, bytes, kind, nullptr);
  if (e != cudaSuccess) return e;
  Drain(Resolve(nullptr));  // synchronous on the legacy stream, which non-blocking streams do not join
  return sticky;
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  EngineLock lock;
  if (sticky != cudaSuccess) return sticky;
  if (!Known(stream)) return Fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (!IsDevice(dst, bytes)) return Fail(cudaErrorInvalidValue);
  Push(stream, [dst, value, bytes] { std::memset(dst, value, bytes); }, {dst});
  return cudaSuccess;
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  EngineLock lock;
  const cudaError_t e = cudaMemsetAsync(dst, value, bytes, nullptr);
  if (e != cudaSuccess) return e;
  Drain(Resolve(nullptr));
  return sticky;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  if (stream == nullptr) return Fail(cudaErrorInvalidValue);
  // The data path creates only non-blocking streams; the legacy stream's implicit
  // synchronization with blocking ones is not emulated.
  if (flags != cudaStreamNonBlocking) return Fail(cudaErrorNotSupported);
  EngineLock lock;
  auto* s = new CUstream_st;
  s->flags = flags;
  s->device = current_device;
  streams.insert(s);
  *stream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  EngineLock lock;
  if (stream == nullptr || streams.count(stream) == 0) return Fail(cudaErrorInvalidResourceHandle);
  Drain(stream);  // its work completes, as CUDA's does after the call returns
  for (CUevent_st* e : events) {
    if (e->stream == stream) e->stream = nullptr;
  }
  streams.erase(stream);
  destroyed_streams.emplace_back(stream);
  return sticky;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  EngineLock lock;
  if (!Known(stream)) return Fail(cudaErrorInvalidResourceHandle);
  Drain(Resolve(stream));
  return sticky;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  if (event == nullptr || (flags & ~cudaEventDisableTiming) != 0) return Fail(cudaErrorInvalidValue);
  EngineLock lock;
  auto* e = new CUevent_st;
  events.insert(e);
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  EngineLock lock;
  if (events.count(event) == 0) return Fail(cudaErrorInvalidResourceHandle);
  if (event->stream != nullptr) RunToEvent(event, event->recorded);  // its record still happens
  events.erase(event);
  delete event;
  return sticky;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  EngineLock lock;
  if (events.count(event) == 0 || !Known(stream)) return Fail(cudaErrorInvalidResourceHandle);
  if (sticky != cudaSuccess) return sticky;
  const uint64_t seq = ++event->recorded;
  event->stream = Resolve(stream);
  event->reported_pending = false;
  Push(stream, [event, seq] { event->completed = std::max(event->completed, seq); });
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  EngineLock lock;
  if (events.count(event) == 0) return Fail(cudaErrorInvalidResourceHandle);
  if (sticky != cudaSuccess) return sticky;
  if (event->completed >= event->recorded) return cudaSuccess;
  // Pending: the stream gets there now, but this query says not yet once, so a caller that
  // polls sees both answers.
  RunToEvent(event, event->recorded);
  if (!event->reported_pending) {
    event->reported_pending = true;
    return cudaErrorNotReady;
  }
  return sticky;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  EngineLock lock;
  if (events.count(event) == 0) return Fail(cudaErrorInvalidResourceHandle);
  if (event->stream != nullptr) RunToEvent(event, event->recorded);
  return sticky;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags) {
  EngineLock lock;
  if (events.count(event) == 0 || !Known(stream) || flags != 0) return Fail(cudaErrorInvalidResourceHandle);
  if (sticky != cudaSuccess) return sticky;
  if (event->stream == nullptr || event->completed >= event->recorded) return cudaSuccess;
  const uint64_t seq = event->recorded;
  Push(stream, [event, seq] {
    if (events.count(event) > 0 && event->stream != nullptr) RunToEvent(event, seq);
  });
  return cudaSuccess;
}
