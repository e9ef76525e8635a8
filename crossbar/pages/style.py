"""The status page's CSS: plain, readable without colour (every state also says itself in
words), and a table per host that folds into cards on a narrow screen."""

# Inside <style> an HTML parser takes text raw, while the flattener escapes "<", ">" and
# "&" as in any text: keep those three characters out of the CSS.
STYLE = """
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1rem;color:#222}
h1{font-size:1.3rem;margin:0}
h1 small{font-weight:400}
h2{font-size:1.1rem;margin:1.5rem 0 .5rem}
p{margin:.3rem 0}
code{font-size:.9em;overflow-wrap:anywhere}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;vertical-align:top;padding:.35rem .5rem;border-bottom:1px solid #ddd}
th{background:#f3f3f3;font-weight:600}
.mark{display:inline-block;padding:0 .5rem;border-radius:.7rem;font-weight:600;white-space:nowrap}
.up{background:#d7f2dc;color:#145a24}
.down{background:#fbe0df;color:#a11a1a}
.unknown{background:#e8e8e8;color:#444}
.banner{background:#fff3c4;border:1px solid #e2c25b;border-radius:.4rem;padding:.4rem .7rem}
.err{color:#a11a1a;overflow-wrap:anywhere}
.muted{color:#777}
.num{text-align:right}
.model{white-space:nowrap}
@media (max-width:720px){
thead{display:none}
table,tbody,tr,td{display:block;width:auto}
tr{border:1px solid #ddd;border-radius:.4rem;margin:0 0 .75rem;padding:.3rem 0}
td{border:0;padding:.15rem .6rem}
td.num{text-align:left}
td::before{content:attr(data-label) ": ";font-weight:600;color:#555}
.model{white-space:normal}
}
"""
