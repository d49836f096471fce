"""Running code written against Grain on gristmill: the ``grain`` import alias
(:mod:`grain_alias`), the table of Grain's modules it maps (:mod:`grain_modules`), and the
few Grain names that libraries wrapping Grain read (:mod:`grain_private`; the Grain-named
base classes Keras looks for are :mod:`gristmill._src.core.grain_types`)."""
