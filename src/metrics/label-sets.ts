import type { Attributes } from '@opentelemetry/api';

/**
 * Hands out one frozen attribute object per label combination, so the fast
 * instruments find their series by object identity (a WeakMap hit) instead of
 * serialising the attributes on every record, and no request allocates label
 * objects once its combination was seen. Past `maxSets` combinations (a label
 * an upstream controls, such as the response model, could take many values)
 * new combinations get fresh objects: still correct, only slower.
 */
export class LabelSets {
  /** A trie over (name, value) pairs: a lookup allocates nothing once a combination was seen. */
  private readonly root = new Node();
  private readonly derived = new WeakMap<Attributes, Map<string, Map<string, Attributes>>>();
  private count = 0;

  constructor(private readonly maxSets = 10_000) {}

  /**
   * The set of these (name, value) pairs (names at even indexes); pairs with an undefined or empty
   * value are left out (Prometheus reads an empty label value as no label: two series would be one).
   */
  of(...pairs: (string | number | undefined)[]): Attributes {
    let node: Node | undefined = this.root;
    for (let i = 0; i < pairs.length && node !== undefined; i += 2) {
      const v = pairs[i + 1];
      if (v !== undefined && v !== '') node = node.next.get(pairs[i] as string)?.get(v);
    }
    if (node?.set !== undefined) return node.set;
    const a: Attributes = {};
    for (let i = 0; i < pairs.length; i += 2) if (pairs[i + 1] !== undefined && pairs[i + 1] !== '') a[pairs[i] as string] = pairs[i + 1];
    const set = Object.freeze(a);
    if (this.count < this.maxSets) {
      this.count++;
      let at: Node = this.root;
      for (let i = 0; i < pairs.length; i += 2) {
        const v = pairs[i + 1];
        if (v === undefined || v === '') continue;
        let byValue = at.next.get(pairs[i] as string);
        if (byValue === undefined) at.next.set(pairs[i] as string, (byValue = new Map()));
        let child: Node | undefined = byValue.get(v);
        if (child === undefined) byValue.set(v, (child = new Node()));
        at = child;
      }
      at.set = set;
    }
    return set;
  }

  /** `base` plus `name: value` (replacing a `name` that `base` has). */
  with(base: Attributes, name: string, value: string): Attributes {
    let byName = this.derived.get(base);
    let byValue = byName?.get(name);
    let set = byValue?.get(value);
    if (set !== undefined) return set;
    set = Object.freeze({ ...base, [name]: value });
    if (this.count < this.maxSets) {
      this.count++;
      if (byName === undefined) this.derived.set(base, (byName = new Map()));
      if (byValue === undefined) byName.set(name, (byValue = new Map()));
      byValue.set(value, set);
    }
    return set;
  }
}

class Node {
  set: Attributes | undefined;
  readonly next = new Map<string, Map<string | number, Node>>();
}
