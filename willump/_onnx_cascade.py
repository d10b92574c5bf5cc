"""The whole cascade as one ONNX model: raw columns in, the cascade's probabilities and the
level that answered each row out, features and routing included.

Why: the per-level export (willump._onnx) needs willump's Python feature code to run; a
pipeline built from scikit-learn featurizers (:func:`willump.from_sklearn`) can be exported
whole, for a runtime without Python (ONNX Runtime in C++, C#, Java, the browser). Each level
is its scikit-learn pipeline (the shared preprocessing, the union restricted to the level's
groups in the level's order, the level's model) converted by skl2onnx; the routing is ONNX
control flow: a level answers the rows whose largest probability reaches its threshold, the
rest are selected (``Compress``) and passed to the next level inside an ``If`` that runs only
when a row is left (the text operators refuse empty batches), so the expensive featurizers
run on the unsure rows only, as in Python. Probabilities are routed and answered in float64,
as willump computes them. A batch of zero rows is refused where the first level has a text
featurizer (ONNX Runtime's StringNormalizer); willump answers it with empty arrays. Groups
that are Python code, and transformers skl2onnx cannot convert, are named with the reason;
nothing is exported then.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

#: ONNX opset of the exported graph (skl2onnx's converters and the routing's operators)
CASCADE_OPSET = 17
#: the ``ai.onnx.ml`` opset skl2onnx's scikit-learn converters use with CASCADE_OPSET
ML_OPSET = 3
#: locale of the text normalisation in converted TfidfVectorizer/CountVectorizer (ONNX
#: Runtime's default, en_US.UTF-8, is missing on minimal Linux images and fails at load)
TEXT_LOCALE = "C.UTF-8"
PROBA = "probabilities"
LEVEL = "level"


def unexportable(opt: Any) -> dict[str, str]:
    """Group (or level model) -> why it cannot be exported; empty when the cascade can be (a
    converter may still refuse: :func:`cascade_model` then raises, naming it)."""
    from ._sklearn import SklearnPipeline

    pipeline = opt.pipeline
    if not isinstance(pipeline, SklearnPipeline):
        return {g: "a Python feature function: only scikit-learn featurizers (willump.from_sklearn) convert to ONNX"
                for g in pipeline.graph.groups}
    why: dict[str, str] = {}
    for name in pipeline.graph.groups:
        reason = _unconvertible(pipeline.branch(name)[0])
        if reason:
            why[name] = reason
    for _, step in pipeline.pre_steps:
        reason = _unconvertible(step)
        if reason:
            why["preprocess"] = reason
    for i, level in enumerate(opt.levels):
        reason = _unconvertible(level.model) if type(level.model).__module__.startswith("sklearn.") else (
            f"{type(level.model).__name__}: the whole-cascade export converts scikit-learn models (the per-level "
            "export covers lightgbm and torch)")
        if reason:
            why[f"level {i} model"] = reason
    return why


def approximate(opt: Any) -> dict[str, str]:
    """Group -> why its exported features only approximate scikit-learn's (exported all the
    same; export_onnx's check measures by how much)."""
    from ._sklearn import SklearnPipeline

    if not isinstance(opt.pipeline, SklearnPipeline):
        return {}
    out = {}
    for name in opt.pipeline.graph.groups:
        for step in _leaves(opt.pipeline.branch(name)[0]):
            if getattr(step, "analyzer", "word") in ("char", "char_wb"):
                out[name] = (f"{type(step).__name__}(analyzer={step.analyzer!r}): skl2onnx's character n-grams differ "
                             "from scikit-learn's on some strings (whitespace); only word analyzers convert exactly")
    return out


def _parts(step: Any) -> list[Any]:
    """The steps inside a scikit-learn Pipeline, FeatureUnion or ColumnTransformer (none for a
    leaf)."""
    parts = [s for _, s in getattr(step, "steps", [])]
    return parts + [p[1] for p in getattr(step, "transformer_list", None) or getattr(step, "transformers_", None) or []]


def _leaves(step: Any):
    """The transformers and models at the bottom of ``step``'s nesting."""
    parts = _parts(step)
    if not parts:
        yield step
    for part in parts:
        yield from _leaves(part)


def _unconvertible(step: Any) -> str | None:
    """Why skl2onnx cannot convert ``step`` (nested pipelines and unions searched), or None."""
    from skl2onnx import get_model_alias

    if step is None or isinstance(step, str):  # "passthrough", "drop"
        return None
    name = type(step).__name__
    parts = _parts(step)
    if parts:
        return next((r for r in map(_unconvertible, parts) if r), None)
    if name == "FunctionTransformer" and step.func is not None:
        return "a FunctionTransformer runs arbitrary Python (skl2onnx converts only the identity)"
    if callable(getattr(step, "analyzer", None)) or callable(getattr(step, "tokenizer", None)) \
            or callable(getattr(step, "preprocessor", None)):
        return f"{name} with a Python analyzer, tokenizer or preprocessor: skl2onnx cannot convert it"
    try:
        get_model_alias(type(step))
    except Exception:
        return f"{name}: skl2onnx has no converter for it"
    return None


def level_pipeline(opt: Any, index: int) -> Any:
    """The scikit-learn pipeline computing level ``index``'s probabilities from raw rows."""
    from sklearn.compose import ColumnTransformer
    from sklearn.pipeline import Pipeline as SkPipeline

    pipeline, level = opt.pipeline, opt.levels[index]
    union = copy.copy(pipeline.union)
    if isinstance(union, ColumnTransformer):
        fitted = {t[0]: t for t in union.transformers_}
        kept = [fitted[g] for g in level.groups]
        union.transformers_ = kept
        union.transformers = list(kept)
        union.remainder = "drop"
    else:
        branches = dict(union.transformer_list)
        union.transformer_list = [(g, branches[g]) for g in level.groups]
    return SkPipeline([*pipeline.pre_steps, ("features", union), ("model", level.model)])


def _convert(sk: Any, sample: Any) -> Any:
    """skl2onnx's model of ``sk`` with the probabilities as its one output."""
    from onnx.utils import Extractor
    from skl2onnx import to_onnx

    options: dict[int, dict[str, Any]] = {id(sk.steps[-1][1]): {"zipmap": False}}
    for step in _leaves(sk):
        if type(step).__name__ in ("TfidfVectorizer", "CountVectorizer"):
            options[id(step)] = {"locale": TEXT_LOCALE}
    model = to_onnx(sk, sample, options=options, target_opset={"": CASCADE_OPSET, "ai.onnx.ml": ML_OPSET})
    return Extractor(model).extract_model([i.name for i in model.graph.input], [PROBA])


def cascade_model(opt: Any, sample: Any) -> Any:
    """The whole cascade as one ONNX ModelProto (module docstring); ``sample``: a few raw rows
    (a DataFrame) giving the input columns and their types."""
    import onnx
    from onnx import TensorProto, helper

    why = unexportable(opt)
    if why:
        raise ValueError("the cascade cannot be exported whole: " + "; ".join(f"{k}: {v}" for k, v in why.items()))
    levels = [_convert(level_pipeline(opt, i), sample) for i in range(len(opt.levels))]
    inputs = list(levels[0].graph.input)
    names = [i.name for i in inputs]
    for m in levels[1:]:
        if [i.name for i in m.graph.input] != names:
            raise ValueError("the levels' ONNX inputs differ; export needs every level to read the same columns")
    n_classes = len(opt.classes_)
    body: list[Any] = []
    outer_inits: list[Any] = []

    def const(name: str, value: Any, dtype: Any) -> str:
        outer_inits.append(helper.make_tensor(name, dtype, np.shape(value), np.ravel(value).tolist()))
        return name

    const("axes1", [1], TensorProto.INT64)
    const("zero_i64", 0, TensorProto.INT64)
    const("one_i64", 1, TensorProto.INT64)
    body += [helper.make_node("Shape", [names[0]], ["n_shape"], start=0, end=1),
             helper.make_node("Squeeze", ["n_shape"], ["n_rows"]),
             helper.make_node("Range", ["zero_i64", "n_rows", "one_i64"], ["pos_0"])]

    def level_nodes(k: int, feeds: dict[str, str]) -> tuple[list[Any], list[Any], str]:
        """Nodes (and initializers) of level k's model reading ``feeds``; its probabilities' name."""
        prefixed = onnx.compose.add_prefix(levels[k], f"l{k}_")
        rename = {f"l{k}_{n}": feeds[n] for n in names}
        nodes = []
        for node in prefixed.graph.node:
            node.input[:] = [rename.get(x, x) for x in node.input]
            nodes.append(node)
        # float64 from here on, as willump routes (_routing.is_confident): a float32 comparison
        # sent rows sitting on a threshold to another level
        nodes.append(helper.make_node("Cast", [f"l{k}_{PROBA}"], [f"l{k}_pf"], to=TensorProto.DOUBLE))
        return nodes, list(prefixed.graph.initializer), f"l{k}_pf"

    def stage(k: int, feeds: dict[str, str], pos: str) -> tuple[list[Any], list[Any], tuple[str, str, str]]:
        """Level k and every later one on ``feeds`` (rows at ``pos``): nodes, initializers and the
        (probabilities, positions, levels) of the rows they answer."""
        nodes, inits, proba = level_nodes(k, feeds)
        if k == len(levels) - 1:
            nodes += [helper.make_node("Shape", [pos], [f"s{k}_n"]),
                      helper.make_node("ConstantOfShape", [f"s{k}_n"], [f"s{k}_lvl"],
                                       value=helper.make_tensor("v", TensorProto.INT64, [1], [k]))]
            return nodes, inits, (proba, pos, f"s{k}_lvl")
        threshold = float(opt.levels[k].threshold)
        inits.append(helper.make_tensor(f"s{k}_t", TensorProto.DOUBLE, [], [threshold]))
        nodes += [helper.make_node("ReduceMax", [proba], [f"s{k}_max"], axes=[1], keepdims=0),
                  helper.make_node("GreaterOrEqual", [f"s{k}_max", f"s{k}_t"], [f"s{k}_done"]),
                  helper.make_node("Not", [f"s{k}_done"], [f"s{k}_keep"]),
                  helper.make_node("Compress", [proba, f"s{k}_done"], [f"s{k}_pd"], axis=0),
                  helper.make_node("Compress", [pos, f"s{k}_done"], [f"s{k}_id"], axis=0),
                  helper.make_node("Shape", [f"s{k}_id"], [f"s{k}_nd"]),
                  helper.make_node("ConstantOfShape", [f"s{k}_nd"], [f"s{k}_ld"],
                                   value=helper.make_tensor("v", TensorProto.INT64, [1], [k])),
                  helper.make_node("Cast", [f"s{k}_keep"], [f"s{k}_keepi"], to=TensorProto.INT64),
                  helper.make_node("ReduceSum", [f"s{k}_keepi", "axes0"], [f"s{k}_left"], keepdims=0),
                  helper.make_node("Greater", [f"s{k}_left", "zero_i64"], [f"s{k}_any"])]
        # the rest: inside an If, so that no later level runs on an empty batch
        sub_feeds = {n: f"s{k + 1}_in_{i}" for i, n in enumerate(names)}
        then_nodes = [helper.make_node("Compress", [feeds[n], f"s{k}_keep"], [sub_feeds[n]], axis=0) for n in names]
        then_nodes.append(helper.make_node("Compress", [pos, f"s{k}_keep"], [f"s{k + 1}_pos"], axis=0))
        rest_nodes, rest_inits, (rp, ri, rl) = stage(k + 1, sub_feeds, f"s{k + 1}_pos")
        then_nodes += rest_nodes
        then_nodes += [helper.make_node("Identity", [rp], [f"s{k}_tp"]), helper.make_node("Identity", [ri], [f"s{k}_ti"]),
                       helper.make_node("Identity", [rl], [f"s{k}_tl"])]
        outs = [helper.make_tensor_value_info(f"s{k}_{x}", t, s) for x, t, s in
                (("tp", TensorProto.DOUBLE, [None, n_classes]), ("ti", TensorProto.INT64, [None]),
                 ("tl", TensorProto.INT64, [None]))]
        then_graph = helper.make_graph(then_nodes, f"rest_{k}", [], outs, initializer=rest_inits)
        else_nodes = [helper.make_node("Constant", [], [f"s{k}_tp"],
                                       value=helper.make_tensor("e", TensorProto.DOUBLE, [0, n_classes], [])),
                      helper.make_node("Constant", [], [f"s{k}_ti"], value=helper.make_tensor("e", TensorProto.INT64, [0], [])),
                      helper.make_node("Constant", [], [f"s{k}_tl"], value=helper.make_tensor("e", TensorProto.INT64, [0], []))]
        else_graph = helper.make_graph(else_nodes, f"none_left_{k}", [], outs)
        nodes += [helper.make_node("If", [f"s{k}_any"], [f"s{k}_rp", f"s{k}_ri", f"s{k}_rl"],
                                   then_branch=then_graph, else_branch=else_graph),
                  helper.make_node("Concat", [f"s{k}_pd", f"s{k}_rp"], [f"s{k}_p"], axis=0),
                  helper.make_node("Concat", [f"s{k}_id", f"s{k}_ri"], [f"s{k}_i"], axis=0),
                  helper.make_node("Concat", [f"s{k}_ld", f"s{k}_rl"], [f"s{k}_l"], axis=0)]
        return nodes, inits, (f"s{k}_p", f"s{k}_i", f"s{k}_l")

    const("axes0", [0], TensorProto.INT64)
    nodes, inits, (proba, pos, lvl) = stage(0, {n: n for n in names}, "pos_0")
    body += nodes
    body += [helper.make_node("Unsqueeze", [pos, "axes1"], ["pos_col"]),
             helper.make_node("Concat", ["n_shape", "n_classes"], ["out_shape"], axis=0),
             helper.make_node("ConstantOfShape", ["out_shape"], ["proba_zero"],
                              value=helper.make_tensor("v", TensorProto.DOUBLE, [1], [0.0])),
             helper.make_node("ScatterND", ["proba_zero", "pos_col", proba], [PROBA]),
             helper.make_node("ConstantOfShape", ["n_shape"], ["level_zero"],
                              value=helper.make_tensor("v", TensorProto.INT64, [1], [0])),
             helper.make_node("ScatterND", ["level_zero", "pos_col", lvl], [LEVEL])]
    const("n_classes", [n_classes], TensorProto.INT64)
    graph = helper.make_graph(
        body, "willump_cascade", inputs,
        [helper.make_tensor_value_info(PROBA, TensorProto.DOUBLE, [None, n_classes]),
         helper.make_tensor_value_info(LEVEL, TensorProto.INT64, [None])],
        initializer=outer_inits + inits)
    opsets = {"": CASCADE_OPSET, "ai.onnx.ml": ML_OPSET}
    for m in levels:  # skl2onnx's text converters add ONNX Runtime's com.microsoft Tokenizer
        for op in m.opset_import:
            opsets[op.domain] = max(opsets.get(op.domain, 0), op.version)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
                              producer_name="willump")
    model.ir_version = levels[0].ir_version
    model.metadata_props.add(key="classes", value=repr([c.item() if hasattr(c, "item") else c for c in opt.classes_]))
    onnx.checker.check_model(model)
    return model


def feeds(model: Any, rows: Any) -> dict[str, np.ndarray]:
    """ONNX Runtime inputs for raw ``rows`` (a DataFrame): one [n, 1] column each, strings as str."""
    out = {}
    for i in model.graph.input:
        column = rows[[i.name]].to_numpy()
        out[i.name] = column.astype(str) if column.dtype.kind in "OSU" else column
    return out
