package tokenizer

import "math"

// The merge loop both encoders share: a word is a chain of symbols, each a
// run of the text, and the adjacent pair with the highest priority is
// merged, the leftmost on a tie, until no adjacent pair merges. SentencePiece
// ranks a pair by the score of the piece it forms, byte-level BPE by the
// rank of the merge rule (lower first, so its priority is minus the rank).
// Priorities are int32 so that a queued candidate, its priority and left
// symbol, is one uint64, and the eight children of a node of the queue's
// 8-ary heap share a cache line: on a megabyte-long word the queue is far
// larger than the caches, and its memory traffic is the cost.

// symbol is text[start:end] of the string being encoded and the piece it
// is (-1 where it is none); end == start once merged into its left
// neighbour.
type symbol struct {
	start, end int32
	prev, next int32 // -1 at the ends
	id         int32
}

// pair is a candidate merge of symbol left with its right neighbour into
// piece id (the linear path's cache of each symbol's merge).
type pair struct {
	id, prio int32
	ok       bool
}

// pairFunc returns the piece two adjacent symbols merge into and the
// merge's priority, or ok false when they do not merge.
type pairFunc func(l, r *symbol) (id, prio int32, ok bool)

// scoreKey maps a score to an int32 of the same order (ties included: -0
// and +0 are one key). Scores are never NaN.
func scoreKey(x float32) int32 {
	if x == 0 {
		return 0
	}
	b := int32(math.Float32bits(x))
	return b ^ (b >> 31 & math.MaxInt32)
}

// linearMax is the longest word merged by scanning for the best pair
// rather than through the queue: a scan costs less than heap upkeep on the
// short words that make up most text, and the queue keeps long ones (a
// megabyte without a space) O(n log n).
const linearMax = 48

// merger holds the buffers of the merge loop, reused across words.
type merger struct {
	syms  []symbol
	queue []uint64
	cache []pair // linear path: each symbol's pair with its right neighbour
}

// reset starts a word of n symbols, returned for the caller to fill (start,
// end and id; prev and next are set).
func (m *merger) reset(n int) []symbol {
	if cap(m.syms) < n {
		m.syms = make([]symbol, n)
	}
	m.syms = m.syms[:n]
	for i := range m.syms {
		m.syms[i].prev, m.syms[i].next = int32(i-1), int32(i+1)
	}
	if n > 0 {
		m.syms[n-1].next = -1
	}
	return m.syms
}

// run merges the word set up by reset; afterwards the chain from symbol 0
// holds the result.
func (m *merger) run(f pairFunc) {
	if len(m.syms) < 2 {
		return
	}
	if len(m.syms) <= linearMax {
		m.runLinear(f)
	} else {
		m.runQueue(f)
	}
}

func (m *merger) runLinear(f pairFunc) {
	syms := m.syms
	if cap(m.cache) < len(syms) {
		m.cache = make([]pair, len(syms))
	}
	cache := m.cache[:len(syms)]
	set := func(i int32) {
		if i < 0 {
			return
		}
		c := &cache[i]
		c.ok = false
		if j := syms[i].next; j >= 0 {
			c.id, c.prio, c.ok = f(&syms[i], &syms[j])
		}
	}
	for i := range syms {
		set(int32(i))
	}
	for {
		best := int32(-1)
		for i := int32(0); i >= 0; i = syms[i].next {
			if c := &cache[i]; c.ok && (best < 0 || c.prio > cache[best].prio) {
				best = i
			}
		}
		if best < 0 {
			return
		}
		l := &syms[best]
		r := &syms[l.next]
		l.end, l.id = r.end, cache[best].id
		r.end = r.start
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = best
		}
		set(l.prev)
		set(best)
	}
}

// queueKey orders candidates as the merge takes them: higher priority
// first, then the leftmost.
func queueKey(prio, left int32) uint64 {
	return uint64(int64(math.MaxInt32)-int64(prio))<<32 | uint64(uint32(left))
}

// runQueue keeps candidates in a priority queue. A candidate names only its
// left symbol: when it comes out, the merge with that symbol's right
// neighbour is looked up again and made if it still has the candidate's
// priority. That is exact: every pair of neighbours was queued when it
// formed, so when a candidate comes out no pair of higher priority, or of
// equal priority further left, remains; an outdated candidate either finds
// a pair of its priority there, which is then the best, or is dropped.
func (m *merger) runQueue(f pairFunc) {
	syms := m.syms
	if want := heapPad + len(syms) + len(syms)/2; cap(m.queue) < want {
		m.queue = make([]uint64, 0, want)
	}
	q := m.queue[:0]
	for range heapPad {
		q = append(q, 0)
	}
	for i := 1; i < len(syms); i++ {
		if _, prio, ok := f(&syms[i-1], &syms[i]); ok {
			q = append(q, queueKey(prio, int32(i-1)))
		}
	}
	m.queue = q
	if n := len(q) - heapPad; n > 1 {
		for i := (n - 2) / heapD; i >= 0; i-- {
			m.down(i)
		}
	}
	try := func(l int32) {
		if l < 0 || syms[l].next < 0 {
			return
		}
		if _, prio, ok := f(&syms[l], &syms[syms[l].next]); ok {
			m.push(queueKey(prio, l))
		}
	}
	for len(m.queue) > heapPad {
		k := m.pop()
		left := int32(uint32(k))
		l := &syms[left]
		if l.end == l.start || l.next < 0 {
			continue
		}
		r := &syms[l.next]
		id, prio, ok := f(l, r)
		if !ok || queueKey(prio, left) != k {
			continue
		}
		l.end, l.id = r.end, id
		r.end = r.start
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = left
		}
		try(l.prev)
		try(left)
	}
}

// The queue is an 8-ary heap, node i at queue[i+heapPad] with its children
// 8i+1 to 8i+8 from a multiple of 8 on, so that they share a cache line.
const (
	heapD   = 8
	heapPad = heapD - 1
)

func (m *merger) push(k uint64) {
	q := append(m.queue, k)
	i := len(q) - 1 - heapPad
	for i > 0 {
		parent := (i - 1) / heapD
		if q[parent+heapPad] <= k {
			break
		}
		q[i+heapPad] = q[parent+heapPad]
		i = parent
	}
	q[i+heapPad] = k
	m.queue = q
}

func (m *merger) pop() uint64 {
	q := m.queue
	top := q[heapPad]
	n := len(q) - 1
	q[heapPad] = q[n]
	m.queue = q[:n]
	if n > heapPad {
		m.down(0)
	}
	return top
}

func (m *merger) down(i int) {
	q := m.queue[heapPad:]
	n := len(q)
	k := q[i]
	for {
		c0 := heapD*i + 1
		if c0 >= n {
			break
		}
		best := c0
		for c := c0 + 1; c < c0+heapD && c < n; c++ {
			if q[c] < q[best] {
				best = c
			}
		}
		if q[best] >= k {
			break
		}
		q[i] = q[best]
		i = best
	}
	q[i] = k
}
