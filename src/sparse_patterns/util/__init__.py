"""Helpers that every part of the package shares: argument checks (:mod:`.checks`), rows
streamed in bounded chunks (:mod:`.stream`), files written atomically and locked
(:mod:`.files`), the mode names (:mod:`.modes`) and attributes imported on first use
(:mod:`.lazy`).

They are modules of their own package, not private modules of the root, so that any
subpackage may import them; they are not part of the user guide's API.
"""
