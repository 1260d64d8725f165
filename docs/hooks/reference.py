"""Generated reference pages: the CLI from the typer app, the HTTP API from its OpenAPI document.

A page holding the line ``<!-- reference: cli -->`` or ``<!-- reference: http -->`` gets the
Markdown written here in its place at build time, so the references cannot drift from the code.
"""

from __future__ import annotations

from typing import Any

MARKER = "<!-- reference: {} -->"


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARKER.format("cli") in markdown:
        markdown = markdown.replace(MARKER.format("cli"), cli_reference())
    if MARKER.format("http") in markdown:
        markdown = markdown.replace(MARKER.format("http"), http_reference())
    return markdown


def cell(text: object) -> str:
    """Text that fits in one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


# --- the CLI -------------------------------------------------------------------------------


def cli_reference() -> str:
    from pgjobs.cli import cli
    from pgjobs.cli.completion import command

    root = command(cli)
    return "\n".join(_command(root, ["pgjobs"], None))


def _command(cmd: Any, path: list[str], parent: Any) -> list[str]:
    ctx = type(cmd).context_class(cmd, info_name=path[-1], parent=parent)
    name = " ".join(path)
    depth = min(len(path) + 1, 4)
    out = [f"{'#' * depth} `{name}`", ""]
    if cmd.help:
        out += [cmd.help.strip(), ""]
    usage = cmd.get_usage(ctx).removeprefix("Usage:").strip()
    out += ["```text", usage, "```", ""]
    rows = []
    for param in cmd.get_params(ctx):
        record = None if getattr(param, "hidden", False) else param.get_help_record(ctx)
        if record is not None:
            rows.append(f"| `{cell(record[0])}` | {cell(record[1])} |")
    if rows:
        out += ["| argument or option | meaning |", "|---|---|", *rows, ""]
    if hasattr(cmd, "list_commands"):
        for sub in cmd.list_commands(ctx):
            child = cmd.get_command(ctx, sub)
            if child is not None and not child.hidden:
                out += _command(child, [*path, sub], ctx)
    return out


# --- the HTTP API --------------------------------------------------------------------------


def http_reference() -> str:
    from pgjobs.web import create_app

    web = create_app(dsn="postgresql://docs@127.0.0.1:1/docs", tokens=["d" * 32])
    return render_openapi(web.openapi())


METHODS = ("get", "put", "post", "delete", "patch", "head")


def render_openapi(doc: dict[str, Any]) -> str:
    info = doc["info"]
    out = [f"OpenAPI {doc.get('openapi', '')}, {info['title']} {info['version']}.", ""]
    for path, item in doc["paths"].items():
        for method in METHODS:
            if method in item:
                out += _operation(method, path, item[method])
    schemas = doc.get("components", {}).get("schemas", {})
    if schemas:
        out += ["## Schemas", ""]
    for name, schema in schemas.items():
        out += _schema(name, schema)
    return "\n".join(out)


def _operation(method: str, path: str, op: dict[str, Any]) -> list[str]:
    out = [f"## `{method.upper()} {path}`", ""]
    if op.get("summary"):
        out += [f"**{op['summary'].strip()}**", ""]
    if op.get("description"):
        out += [op["description"].strip(), ""]
    params = op.get("parameters", [])
    if params:
        out += ["| parameter | in | type | required | meaning |", "|---|---|---|---|---|"]
        for p in params:
            schema = p.get("schema", {})
            meaning = p.get("description") or schema.get("description", "")
            required = "yes" if p.get("required") else "no"
            out.append(
                f"| `{p['name']}` | {p['in']} | {cell(_type(schema))} | {required} "
                f"| {cell(meaning)} |"
            )
        out.append("")
    for media, content in op.get("requestBody", {}).get("content", {}).items():
        out += [f"Request body ({media}): {_type(content.get('schema', {}))}", ""]
    out += ["| status | meaning | body |", "|---|---|---|"]
    for status, response in op.get("responses", {}).items():
        bodies = [
            f"{media}: {_type(c.get('schema', {}))}"
            for media, c in response.get("content", {}).items()
        ]
        out.append(
            f"| {status} | {cell(response.get('description', ''))} | {cell('; '.join(bodies))} |"
        )
    return [*out, ""]


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    out = [f"### {name}", ""]
    if schema.get("description"):
        out += [" ".join(schema["description"].split()), ""]
    props = schema.get("properties", {})
    required = set(schema.get("required", []))
    if props:
        out += ["| field | type | required | meaning |", "|---|---|---|---|"]
        for field, prop in props.items():
            out.append(
                f"| `{field}` | {cell(_type(prop))} | {'yes' if field in required else 'no'} "
                f"| {cell(prop.get('description', ''))} |"
            )
        out.append("")
    elif "enum" in schema:
        out += ["One of: " + ", ".join(f"`{v}`" for v in schema["enum"]), ""]
    return out


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_type(s) for s in schema[key])
    if "allOf" in schema:
        return " and ".join(_type(s) for s in schema["allOf"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema:
        extra = schema["additionalProperties"]
        if isinstance(extra, dict) and extra:
            return f"object of {_type(extra)}"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    bounds = [
        f"{label} {schema[key]}"
        for key, label in (
            ("minimum", "≥"),
            ("maximum", "≤"),
            ("exclusiveMinimum", ">"),
            ("minLength", "length ≥"),
            ("maxLength", "length ≤"),
        )
        if key in schema
    ]
    fmt = f" ({schema['format']})" if "format" in schema else ""
    return str(kind) + fmt + (f" ({', '.join(bounds)})" if bounds else "")
