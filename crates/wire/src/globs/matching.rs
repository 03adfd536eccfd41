//! Matching a path (by segments, no allocation) and deciding overlaps (by
//! characters, over the product of two patterns).

use super::{CTok, Class, PathGlob, Seg, Tok};

/// Whether `glob` matches `path` or one of its ancestor directories. The
/// wildcard algorithm over segments, `AnyNames` the star: after a mismatch
/// only the last `AnyNames` needs to absorb one more segment. A pattern used
/// up before the path matched an ancestor.
pub(super) fn matches(glob: &PathGlob, path: &str) -> bool {
    let segs = &glob.segs;
    let end = path.len() + 1; // `si == end`: the path is used up
    let (mut pi, mut si) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    loop {
        if pi == segs.len() {
            return true;
        }
        if si >= end {
            return segs[pi..].iter().all(|s| *s == Seg::AnyNames);
        }
        let seg_end = segment_end(path, si);
        let advanced = match segs[pi] {
            Seg::AnyNames => {
                star = Some((pi, si));
                pi += 1;
                continue;
            }
            Seg::AnyName => true,
            Seg::Name { start, end } => segment_matches(
                &glob.toks[start as usize..end as usize],
                &glob.classes,
                &path[si..seg_end],
            ),
        };
        if advanced {
            pi += 1;
            si = seg_end + 1;
            continue;
        }
        match star {
            Some((sp, ss)) => {
                let next = segment_end(path, ss) + 1;
                star = Some((sp, next));
                pi = sp + 1;
                si = next;
            }
            None => return false,
        }
    }
}

fn segment_end(path: &str, from: usize) -> usize {
    path[from..].find('/').map_or(path.len(), |k| from + k)
}

/// One segment against one name: the wildcard algorithm over characters.
fn segment_matches(toks: &[Tok], classes: &[Class], name: &str) -> bool {
    let (mut ti, mut ni) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    loop {
        let Some(c) = name[ni..].chars().next() else {
            return toks[ti..].iter().all(|t| *t == Tok::Star);
        };
        if ti < toks.len() {
            let ok = match toks[ti] {
                Tok::Star => {
                    star = Some((ti, ni));
                    ti += 1;
                    continue;
                }
                Tok::Lit(x) => x == c,
                Tok::One => true,
                Tok::Class(k) => classes[k as usize].contains(c),
            };
            if ok {
                ti += 1;
                ni += c.len_utf8();
                continue;
            }
        }
        match star {
            Some((st, sn)) => {
                let skipped = name[sn..].chars().next().map_or(1, char::len_utf8);
                star = Some((st, sn + skipped));
                ti = st + 1;
                ni = sn + skipped;
            }
            None => return false,
        }
    }
}

/// The state of a valid path's last segment so far: empty, `.`, `..`, or a
/// name (the only state a path may end in or leave with `/`).
const V_EMPTY: u8 = 0;
const V_DOT: u8 = 1;
const V_DOTDOT: u8 = 2;
const V_NAME: u8 = 3;

fn valid_step(v: u8, c: char) -> Option<u8> {
    match c {
        '/' => (v == V_NAME).then_some(V_EMPTY),
        '.' => Some(match v {
            V_EMPTY => V_DOT,
            V_DOT => V_DOTDOT,
            _ => V_NAME,
        }),
        _ => Some(V_NAME),
    }
}

/// One side of the product: positions `0..n` are tokens, `n` the end (the
/// pattern matched), `n + 1` below a match (anything).
struct Side<'a> {
    toks: &'a [CTok],
    classes: &'a [Class],
}

impl Side<'_> {
    fn end(&self) -> usize {
        self.toks.len()
    }

    fn below(&self) -> usize {
        self.toks.len() + 1
    }

    /// Where position `i` may go without taking a character.
    fn skip(&self, i: usize) -> Option<usize> {
        match self.toks.get(i)? {
            CTok::Star | CTok::AnyRest => Some(i + 1),
            CTok::AnyDirs => Some(i + 2),
            _ => None,
        }
    }

    /// The only character that moves this side on, when there is one.
    fn only(&self, i: usize) -> Option<char> {
        if i == self.end() {
            return Some('/');
        }
        match self.toks.get(i) {
            Some(CTok::Lit(c)) => Some(*c),
            _ => None,
        }
    }

    /// Where `c` takes position `i` (up to two places).
    fn step(&self, i: usize, c: char) -> [Option<usize>; 2] {
        if i == self.below() {
            return [Some(i), None];
        }
        if i == self.end() {
            return [(c == '/').then_some(self.below()), None];
        }
        let next = Some(i + 1);
        match self.toks[i] {
            CTok::Lit(x) => [(x == c).then_some(i + 1), None],
            CTok::One => [next.filter(|_| c != '/'), None],
            CTok::Class(k) => [next.filter(|_| self.classes[k as usize].contains(c)), None],
            CTok::Star => [(c != '/').then_some(i), None],
            CTok::AnyDirs => [next, Some(i + 2).filter(|_| c == '/')],
            CTok::DirsBody => [Some(i), next.filter(|_| c == '/')],
            CTok::AnyRest => [Some(i), None],
        }
    }
}

/// Whether some valid path is covered by both: a search of the product of
/// the two patterns and the valid-path automaton, states `(i, j, v)`, each
/// visited once.
pub(super) fn overlaps(a: &PathGlob, b: &PathGlob) -> bool {
    search(a, b, false).is_some()
}

/// A path both cover, when there is one (for tests and messages).
#[cfg(test)]
pub(super) fn witness(a: &PathGlob, b: &PathGlob) -> Option<String> {
    search(a, b, true)
}

type State = (usize, usize, u8);

/// The search; with `record`, each state's first parent and the character
/// that led there are kept, and the answer spells the path found.
fn search(a: &PathGlob, b: &PathGlob, record: bool) -> Option<String> {
    let a = Side {
        toks: &a.chars,
        classes: &a.classes,
    };
    let b = Side {
        toks: &b.chars,
        classes: &b.classes,
    };
    let candidates = representatives(&a, &b);
    let wb = b.below() + 1;
    let index = |(i, j, v): State| (i * wb + j) * 4 + v as usize;
    let mut seen = vec![0u64; ((a.below() + 1) * wb * 4).div_ceil(64)];
    let mut parents: std::collections::HashMap<usize, (State, Option<char>)> = Default::default();
    let mut stack: Vec<State> = Vec::new();
    let mut visit = |to: State, from: State, c: Option<char>, stack: &mut Vec<State>| {
        let k = index(to);
        if seen[k / 64] & (1 << (k % 64)) == 0 {
            seen[k / 64] |= 1 << (k % 64);
            stack.push(to);
            if record {
                parents.insert(k, (from, c));
            }
        }
    };
    let start = (0, 0, V_EMPTY);
    visit(start, start, None, &mut stack);
    while let Some(at) = stack.pop() {
        let (i, j, v) = at;
        if v == V_NAME && i >= a.end() && j >= b.end() {
            return Some(spell(&parents, at, index));
        }
        if let Some(i) = a.skip(i) {
            visit((i, j, v), at, None, &mut stack);
        }
        if let Some(j) = b.skip(j) {
            visit((i, j, v), at, None, &mut stack);
        }
        let single;
        let chars: &[char] = match (a.only(i), b.only(j)) {
            (Some(x), Some(y)) if x != y => continue,
            (Some(x), _) | (None, Some(x)) => {
                single = [x];
                &single
            }
            (None, None) => &candidates,
        };
        for &c in chars {
            let Some(nv) = valid_step(v, c) else {
                continue;
            };
            let sa = a.step(i, c);
            if sa == [None, None] {
                continue;
            }
            let sb = b.step(j, c);
            for ia in sa.into_iter().flatten() {
                for jb in sb.into_iter().flatten() {
                    visit((ia, jb, nv), at, Some(c), &mut stack);
                }
            }
        }
    }
    None
}

/// The path that led to `at` (empty when parents were not kept).
fn spell(
    parents: &std::collections::HashMap<usize, (State, Option<char>)>,
    mut at: State,
    index: impl Fn(State) -> usize,
) -> String {
    let mut out = Vec::new();
    while let Some(&(from, c)) = parents.get(&index(at)) {
        if from == at {
            break;
        }
        out.extend(c);
        at = from;
    }
    out.into_iter().rev().collect()
}

/// One valid path character from every run of characters that no test of
/// either pattern (nor `/` or `.`) tells apart.
fn representatives(a: &Side<'_>, b: &Side<'_>) -> Vec<char> {
    let mut bounds: Vec<u32> = vec![0, '.' as u32, '.' as u32 + 1, '/' as u32, '/' as u32 + 1];
    for side in [a, b] {
        for t in side.toks {
            if let CTok::Lit(c) = t {
                bounds.extend([*c as u32, *c as u32 + 1]);
            }
        }
        for class in side.classes {
            for &(lo, hi) in &class.ranges {
                bounds.extend([lo as u32, hi as u32 + 1]);
            }
        }
    }
    bounds.sort_unstable();
    bounds.dedup();
    let mut out = Vec::with_capacity(bounds.len());
    for (k, &lo) in bounds.iter().enumerate() {
        let hi = bounds.get(k + 1).copied().unwrap_or(char::MAX as u32 + 1);
        if let Some(c) = first_valid(lo, hi) {
            out.push(c);
        }
    }
    out
}

/// The first character in `lo..hi` a path may hold (not a control).
fn first_valid(lo: u32, hi: u32) -> Option<char> {
    let mut c = lo;
    while c < hi {
        match char::from_u32(c) {
            Some(ch) if !ch.is_control() => return Some(ch),
            Some(_) if c < 0x20 => c = 0x20,
            Some(_) => c = 0xA0,
            None => c = 0xE000,
        }
    }
    None
}
