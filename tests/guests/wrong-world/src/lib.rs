//! A component that is not an idem handler: it exports `handle` with another
//! signature. The host must refuse to load it, naming the export.

wit_bindgen::generate!({
    inline: "
        package test:wrong;
        world wrong {
            export handle: func(payload: string) -> result<_, string>;
        }
    ",
});

struct Wrong;

impl Guest for Wrong {
    fn handle(_payload: String) -> Result<(), String> {
        Ok(())
    }
}

export!(Wrong);
