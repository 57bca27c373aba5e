"""``ta.viz.graph(t)``: the computation graph that produced ``t``, as DOT text or a picture.

    loss = model(x, y)[1]
    print(ta.viz.graph(loss, depth=1))             # DOT text: paste it into any Graphviz viewer
    ta.viz.graph(loss, "gpt.png", depth=1)         # a picture (PNG or SVG), no Graphviz needed

Each op is a box with its name, its output shape and dtype. Leaves (inputs and
parameters) are named after the parameter where a module owns them
(``h.0.attn.c_attn.weight``). A solid arrow carries a gradient; a dashed one
does not. ``depth=1`` draws each module one level down (``h.0``, ``ln_f``...)
as one box, so a whole GPT fits on a page; ``depth=2`` opens the blocks.

Pictures are laid out in rows, inputs at the top and ``t`` at the bottom, and
drawn with matplotlib (the ``viz`` extra). When the Graphviz program ``dot``
is installed it draws them instead.

Draw the graph before ``backward()``: backward frees the graph's saved inputs
(unless ``retain_graph=True``), and a freed op is drawn without its inputs.

In training, the fast layer runs each GPT block as one fused op; the drawing
shows its ops all the same, computed again one by one from the block's inputs.
"""
import os
import shutil
import subprocess

from .tensor import Tensor
from .nn.modules import Parameter


class _Node:
    def __init__(self, kind, lines, grad):
        self.kind = kind        # "op", "leaf", "module" or "freed"
        self.lines = lines      # label, one string per line
        self.grad = grad        # does a gradient flow through it?
        self.root = False


def _describe(t):
    return f"{t.shape} {t.dtype}"


def _level(name):
    """How deep a module sits: 'h.0' is 1 (a ModuleList index joins its list), 'h.0.attn' is 2."""
    if not name:
        return 0
    parts = name.split(".")
    return sum(1 for i, p in enumerate(parts) if not (p.isdigit() and i > 0))


class _Graph:
    """Nodes and edges of the graph behind one tensor."""

    def __init__(self, root, depth=None, params=None):
        self.nodes, self.edges = {}, {}        # key -> _Node; (src, dst) -> gradient flows
        self.tensors = {}                      # key -> the tensor a node stands for (its output)
        self.names = {id(p): name for name, p in (params or {}).items()}
        self._walk(root)
        self._name_from_modules()
        self._label_leaves()
        self.box_of = {}                       # node key -> key of the module box it was folded into
        if depth is not None:
            self._collapse(depth)
        key = self.key(root)
        self.nodes[self.box_of.get(key, key)].root = True

    @staticmethod
    def key(t):
        return f"op{id(t.grad_fn)}" if t.grad_fn is not None else f"t{id(t)}"

    def _walk(self, root):
        stack = [root]
        while stack:
            t = stack.pop()
            key = self.key(t)
            if key in self.nodes:
                continue
            self.tensors[key] = t
            ctx = t.grad_fn
            if ctx is not None and ctx.parents is not None and hasattr(ctx, "unfused"):
                ctx = ctx.unfused().grad_fn        # a fused op (the fast layer's whole GPT block): drawn as its ops
            if ctx is None:
                self.nodes[key] = _Node("leaf", [], t.requires_grad)
                continue
            lines = [type(ctx).__name__, _describe(t)]
            if ctx.parents is None:
                self.nodes[key] = _Node("freed", lines + ["(inputs freed by backward)"], True)
                continue
            self.nodes[key] = _Node("op", lines, True)
            for p in ctx.parents:
                self.edges[(self.key(p), key)] = p.requires_grad
                stack.append(p)

    def _module_calls(self):
        """(module, ids of its input tensors, key of its output op), for every module call in the graph."""
        calls = []
        for key, t in self.tensors.items():
            note = t.grad_fn.__dict__.get("module_call") if t.grad_fn is not None else None
            while note is not None:                        # the outermost module first
                module, args, note = note
                input_ids = frozenset(id(a) for a in args if isinstance(a, Tensor))
                if id(t) not in input_ids:                 # Dropout(p=0) hands its input back
                    calls.append((module, input_ids, key))
        return calls

    def _name_from_modules(self):
        """Qualified names of the modules seen, from the outermost module that was called."""
        modules = {id(m): m for m, _, _ in self._module_calls()}
        inner = {id(sub) for m in modules.values() for sub in m.modules() if sub is not m}
        self.module_names = {}
        for m in modules.values():
            if id(m) in inner:
                continue
            for name, sub in m.named_modules():
                self.module_names.setdefault(id(sub), name)
            for name, p in m.named_parameters():
                self.names.setdefault(id(p), name)

    def _label_leaves(self):
        for key, node in self.nodes.items():
            if node.kind == "leaf":
                t = self.tensors[key]
                default = "parameter" if isinstance(t, Parameter) else "input"   # a name from params= wins
                if t.numel() == 1 and not t.requires_grad:
                    default = f"constant {t.item():.4g}"           # e.g. the 1/sqrt(d) of attention
                name = self.names.get(id(t), default)
                node.lines = [name, _describe(t), "requires grad" if t.requires_grad else "no grad"]

    def _collapse(self, depth):
        """Fold the ops of each module at ``depth`` (and of leaf modules above it) into one box."""
        box_of, box_inputs, preds = {}, {}, {}
        for src, dst in self.edges:
            preds.setdefault(dst, []).append(src)
        for module, input_ids, out_key in self._module_calls():
            name = self.module_names.get(id(module), type(module).__name__)
            level = _level(name)
            if not (level == depth or (level < depth and not module._modules)) or out_key in box_of:
                continue
            box = f"box{len(box_of)}_{out_key}"
            members, stack = [], [out_key]
            while stack:
                key = stack.pop()
                if (key in box_of or key in members or id(self.tensors[key]) in input_ids
                        or self.nodes[key].kind == "leaf"):
                    continue
                members.append(key)
                stack.extend(preds.get(key, ()))
            out = self.tensors[out_key]
            self.nodes[box] = _Node("module", [name or "(model)", type(module).__name__, _describe(out)], True)
            self.tensors[box] = out
            box_inputs[box] = input_ids
            for key in members:
                box_of[key] = box
        self.box_of = box_of
        if not box_of:
            return
        users = {}
        for src, dst in self.edges:
            users.setdefault(src, set()).add(box_of.get(dst, dst))
        for key, node in self.nodes.items():   # a leaf used by one box only goes in it, unless it is its input
            if node.kind == "leaf" and len(users.get(key, ())) == 1:
                (user,) = users[key]
                if user in box_inputs and id(self.tensors[key]) not in box_inputs[user]:
                    box_of[key] = user
        edges = {}
        for (src, dst), grad in self.edges.items():
            src, dst = box_of.get(src, src), box_of.get(dst, dst)
            if src != dst:
                edges[(src, dst)] = edges.get((src, dst), False) or grad
        self.edges = edges
        for key in box_of:
            del self.nodes[key]

    # --- output ---
    def dot(self):
        style = {"op": 'fillcolor="#dbe9f6"', "leaf": 'fillcolor="#d9f2d9"', "module": 'fillcolor="#f9e3c6"',
                 "freed": 'fillcolor="#eeeeee"'}
        out = ["digraph {", '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];']
        short = {key: f"n{i}" for i, key in enumerate(self.nodes)}
        for key, node in self.nodes.items():
            fill = style[node.kind]
            if node.kind == "leaf" and not node.grad:
                fill = 'fillcolor="#eeeeee"'
            label = "\\n".join(line.replace('"', '\\"') for line in node.lines)
            extra = ", penwidth=2" if node.root else ""
            out.append(f'  {short[key]} [label="{label}", {fill}{extra}];')
        for (src, dst), grad in self.edges.items():
            out.append(f"  {short[src]} -> {short[dst]}" + ("" if grad else " [style=dashed]") + ";")
        out.append("}")
        return "\n".join(out) + "\n"

    def rows(self):
        """Node keys in rows: each node one row below the last of its inputs."""
        preds = {key: [] for key in self.nodes}
        for src, dst in self.edges:
            preds[dst].append(src)
        row, users = {}, {}
        for key in _toposort(self.nodes, preds):
            row[key] = 1 + max((row[p] for p in preds[key]), default=-1)
            for p in preds[key]:
                users.setdefault(p, []).append(key)
        for key in row:                       # a leaf sits just above its first user
            if not preds[key] and key in users:
                row[key] = min(row[u] for u in users[key]) - 1
        low = min(row.values())
        row = {key: r - low for key, r in row.items()}
        rows = [[] for _ in range(max(row.values()) + 1)]
        for key, r in row.items():
            rows[r].append(key)
        # order each row by where its inputs sit (the barycentre heuristic): fewer crossings
        x = {}
        for keys in rows:
            keys.sort(key=lambda k: sum(x[p] for p in preds[k]) / len(preds[k]) if preds[k] else 0.0)
            for i, k in enumerate(keys):
                x[k] = i - (len(keys) - 1) / 2
        return rows, x, preds


def _toposort(nodes, preds):
    """Every node after all its inputs (Kahn's algorithm)."""
    waiting = {key: len(set(preds[key])) for key in nodes}
    users = {key: set() for key in nodes}
    for key in nodes:
        for p in set(preds[key]):
            users[p].add(key)
    ready = [key for key, n in waiting.items() if n == 0]
    order = []
    while ready:
        key = ready.pop()
        order.append(key)
        for user in users[key]:
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    if len(order) != len(nodes):
        raise RuntimeError("the graph has a cycle")
    return order


def _dot_program():
    return shutil.which("dot")


def _draw_with_dot(dot_text, path, program):
    fmt = os.path.splitext(path)[1][1:]
    subprocess.run([program, f"-T{fmt}", "-o", path], input=dot_text.encode(), check=True)


def _draw_with_matplotlib(g, path):
    try:
        from matplotlib.figure import Figure          # no pyplot: the caller's plotting state is left alone
        from matplotlib.patches import FancyBboxPatch
    except ImportError:
        raise RuntimeError("drawing a graph needs matplotlib: pip install -e \".[viz]\"") from None
    rows, x, preds = g.rows()
    width_in, height_in = 2.0, 0.95                     # one node's cell, in inches
    widest = max(len(r) for r in rows)
    fig_w = min(max(3.0, widest * width_in), 60.0)
    fig_h = min(max(2.0, len(rows) * height_in), 120.0)
    fig = Figure(figsize=(fig_w, fig_h))
    ax = fig.subplots()
    y = {key: -r for r, keys in enumerate(rows) for key in keys}
    colours = {"op": "#dbe9f6", "leaf": "#d9f2d9", "module": "#f9e3c6", "freed": "#eeeeee"}
    for (src, dst), grad in g.edges.items():
        ax.annotate("", xy=(x[dst], y[dst] + 0.28), xytext=(x[src], y[src] - 0.28),
                    arrowprops=dict(arrowstyle="-|>", color="#555555", lw=0.8, shrinkA=0, shrinkB=0,
                                    linestyle="-" if grad else "--"))
    for key, node in g.nodes.items():
        fill = colours[node.kind] if node.grad or node.kind != "leaf" else "#eeeeee"
        ax.add_patch(FancyBboxPatch((x[key] - 0.44, y[key] - 0.28), 0.88, 0.56, boxstyle="round,pad=0.02",
                                    facecolor=fill, edgecolor="black", linewidth=2 if node.root else 0.8))
        ax.text(x[key], y[key], "\n".join(node.lines), ha="center", va="center", fontsize=7)
    ax.set_xlim(min(x.values()) - 0.6, max(x.values()) + 0.6)
    ax.set_ylim(-len(rows) + 0.5, 0.5)
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def graph(t, path=None, depth=None, params=None):
    """The graph that produced tensor ``t``, as DOT text.

    path    also draw it there (``.png`` or ``.svg``), with ``dot`` when it is
            installed, else with matplotlib.
    depth   fold each module at that depth into one box (1: the model's
            blocks and layers; None: every op).
    params  optional {name: tensor} for leaves no module owns.
    """
    if not isinstance(t, Tensor):
        raise TypeError(f"graph() needs a Tensor, got {type(t).__name__}")
    if depth is not None and depth < 0:
        raise ValueError(f"depth must be None or >= 0, got {depth}")
    if path is not None and os.path.splitext(path)[1].lower() not in (".png", ".svg"):
        raise ValueError(f"graph() draws .png or .svg files, not {path!r}")
    g = _Graph(t, depth, params)
    text = g.dot()
    if path is not None:
        program = _dot_program()
        if program:
            _draw_with_dot(text, path, program)
        else:
            _draw_with_matplotlib(g, path)
    return text
